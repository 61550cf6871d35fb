"""Offline replay of the engine's accept-then-advance rule for greedy decoding (no engine).

Each step the proposer drafts ≤ k tokens; the "engine" accepts the longest prefix that matches the
target continuation and then emits the next target token itself; like the engine adapter, it never
drafts past the last target token. ``proposed``/``accepted`` count every draft (as the engine does),
``prediction_accepted``/``prediction_rejected`` only those from the prediction (the usage fields).
Used by tests and benchmarks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from cascade.predict.code_datastore import CodeDatastore
from cascade.predict.datastore_corpus import datastore_for
from cascade.predict.draft_length import DraftLength
from cascade.predict.static_text import Mode, PredictionState
from cascade.predict.token_source import TokenNgramSource
from cascade.predict.vocabulary import Vocabulary


@dataclass
class SimulationResult:
    tokens: list[int]
    accepted_per_step: list[int] = field(default_factory=list)
    drafted_per_step: list[int] = field(default_factory=list)
    proposed: int = 0
    accepted: int = 0
    prediction_accepted: int = 0
    prediction_rejected: int = 0
    state: PredictionState | None = None

    @property
    def steps(self) -> int:
        return len(self.accepted_per_step)

    @property
    def rejected(self) -> int:
        return self.proposed - self.accepted

    @property
    def tokens_per_step(self) -> float:
        return len(self.tokens) / self.steps if self.steps else 0.0


def simulate(target: Sequence[int], prediction: Sequence[int], vocab: Vocabulary, k: int,
             prompt: Sequence[int] | None = None, mode: Mode = "smart",
             lengths: DraftLength | None = None, sampled: bool = False,
             responses: TokenNgramSource | None = None,
             datastore: CodeDatastore | Literal["service"] | None = "service") -> SimulationResult:
    """Generate ``target`` with drafts from ``prediction`` (and ``prompt``, the request's prompt token
    ids, as the service passes them); the output is always ``target`` itself. The defaults are the
    service's: the same ``PredictionState`` with the same defaults ``StaticTextProposer`` gives it.
    ``sampled``: draft as for a request sampled at a temperature above 0 (the replay still accepts
    only the target's tokens). ``responses``: earlier responses to draft from, as the service's response
    cache gives them (``ResponseCache.source``; None: a lone request on a fresh service). ``datastore``:
    the code datastore to draft new code from; "service": the one the service builds for a tokenizer's
    vocabulary with its default settings (``datastore_for``: none for other vocabularies), None: none,
    as a service with ``prediction_datastore_mib`` 0 runs."""
    if datastore == "service":
        datastore = datastore_for(vocab)
    state = PredictionState(prediction, vocab, mode=mode, lengths=lengths, prompt_ids=prompt or (), k=k,
                            sampled=sampled, responses=responses, datastore=datastore)
    result = SimulationResult(tokens=[], state=state)
    draft: list[int] = []
    while len(result.tokens) < len(target):
        position = len(result.tokens)
        accepted = 0
        while (accepted < len(draft) and position + accepted < len(target)
               and draft[accepted] == target[position + accepted]):
            accepted += 1
        step_tokens = list(target[position:position + accepted + 1])
        result.tokens += step_tokens
        result.accepted_per_step.append(accepted)
        result.drafted_per_step.append(len(draft))
        state.observe(step_tokens)
        draft = state.propose(min(k, len(target) - len(result.tokens) - 1))
    result.proposed = state.proposed
    result.accepted = state.accepted
    result.prediction_accepted = state.prediction_accepted
    result.prediction_rejected = state.prediction_rejected
    return result
