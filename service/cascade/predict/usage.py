"""Which drafted prediction tokens ended up in the answer: OpenAI's usage counts, per step.

vLLM's own spec-decode summary cannot give them. It counts every step the engine ran, and after a
stop string the engine may run several more steps before the gateway's abort reaches it (the stop is
found while detokenising, outside the engine), or the summary never arrives at all. It also
cannot tell drafts taken from the prediction from drafts taken from the prompt or the output.

So the proposer keeps a ledger per request: for each engine step, how many tokens the step emitted
and how many of its drafted and accepted tokens came from the prediction. Once the answer is
known, ``counts(answer_tokens)`` walks the steps. A step inside the answer counts as vLLM counts
it: every drafted prediction token, of which the accepted ones. The step the answer ends in counts
only the draft positions inside the answer; steps after it (the engine running past a stop
string) were not this answer's work and count neither way.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Step:
    emitted: int  # tokens this step added to the output: accepted drafts, then one token of the model's own
    drafted: int  # prediction tokens drafted for this step
    accepted: int  # of those, accepted (the first ``accepted`` tokens the step emitted)


@dataclass
class PredictionLedger:
    steps: list[Step] = field(default_factory=list)

    def record(self, emitted: int, drafted: int, accepted: int) -> None:
        if emitted <= 0:
            return
        accepted = max(0, min(accepted, drafted, emitted - 1))
        self.steps.append(Step(emitted, max(0, drafted), accepted))

    def counts(self, answer_tokens: int | None = None) -> tuple[int, int]:
        """(drafted, accepted) prediction tokens over the first ``answer_tokens`` output tokens
        (all of them when None)."""
        drafted = accepted = position = 0
        for step in self.steps:
            if answer_tokens is not None and position >= answer_tokens:
                break
            kept = step.emitted if answer_tokens is None else min(step.emitted, answer_tokens - position)
            drafted += step.drafted if kept == step.emitted else min(step.drafted, kept)
            accepted += min(step.accepted, kept)
            position += step.emitted
        return drafted, accepted


class FinishedLedgers:
    """Ledgers of requests the runner no longer holds, kept until the gateway asks (bounded)."""

    def __init__(self, capacity: int = 4096) -> None:
        self.capacity = capacity
        self._ledgers: OrderedDict[str, PredictionLedger] = OrderedDict()

    def __len__(self) -> int:
        return len(self._ledgers)

    def put(self, request_id: str, ledger: PredictionLedger) -> None:
        self._ledgers[request_id] = ledger
        self._ledgers.move_to_end(request_id)
        while len(self._ledgers) > self.capacity:
            self._ledgers.popitem(last=False)

    def pop(self, request_id: str) -> PredictionLedger | None:
        return self._ledgers.pop(request_id, None)


def external_id(internal_id: str) -> str:
    """vLLM 0.32 runs a request as ``f"{external_id}-{8 random characters}"``; the gateway knows
    the external one."""
    head, dash, tail = internal_id.rpartition("-")
    return head if dash and len(tail) == 8 else internal_id
