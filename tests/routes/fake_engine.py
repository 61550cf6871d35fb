"""A stand-in for the engine adapter (``cascade.engine.manager.EngineManager``), for route tests.

Routes talk to the adapter only in Cascade's types (``cascade.engine.types``), so HTTP behaviour —
shapes, streaming, errors, disconnects, limits — can be tested in seconds against this fake, with
the real model's tokenizer (``tokenizers``, no torch). Engine behaviour itself is tested on real
vLLM engines under ``tests/integration``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cascade.engine.types import (
    Candidate,
    CompletionDelta,
    EngineRequestError,
    Generation,
    GenerationRequest,
    PredictionCounts,
    TokenLogprobs,
)
from cascade.export.topk import ExportPosition
from tokenizers import Tokenizer

MODEL_DIR = Path(__file__).resolve().parents[2] / "models" / "pycoder-23m"
REPLY = "    return value + 1\n"


class FastTokenizer:
    """The model's tokenizer through ``tokenizers`` with the few Hugging Face methods routes use."""

    chat_template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"

    def __init__(self, path: Path = MODEL_DIR / "tokenizer.json") -> None:
        self._tok = Tokenizer.from_file(str(path))
        self.eos_token_id = self._tok.token_to_id("</s>")
        self.all_special_ids = [i for i in (self.eos_token_id, self._tok.token_to_id("<s>")) if i is not None]

    def __len__(self) -> int:
        return int(self._tok.get_vocab_size())

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False, **_: Any) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return [self._tok.id_to_token(i) or "" for i in ids]

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool = False,
                            **options: Any) -> str:
        self.template_options = options
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


@dataclass
class FakeEngines:
    """Generates ``REPLY``'s tokens over and over (deterministic), with made-up log-probabilities.

    ``fail_after``: raise this exception after that many outputs (a failure mid-stream);
    ``refuse``: raise it when a request is admitted (vLLM's validation at admission);
    ``delay``: seconds between streamed outputs, so a test can drop a client mid-way."""

    tokenizer: FastTokenizer = field(default_factory=FastTokenizer)
    fingerprint: bytes = b"\0" * 32
    started_at: float = field(default_factory=time.time)
    aborted: int = 0
    running: int = 0
    requests: list[tuple[list[int], GenerationRequest]] = field(default_factory=list)
    fail_after: tuple[int, Exception] | None = None
    refuse: Exception | None = None
    delay: float = 0.0
    ready: bool = True
    dead: bool = False

    # --- what routes and the lifecycle call -------------------------------------------------------

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset({self.tokenizer.eos_token_id})

    async def start(self) -> None:
        self.ready = True

    def shutdown(self) -> None:
        self.ready = False

    async def close(self) -> None:
        self.shutdown()

    def not_ready_reason(self) -> str:
        return "engine is starting"

    def check_ready(self) -> None:
        from cascade.engine.manager import EngineNotReadyError

        if not self.ready:
            raise EngineNotReadyError(self.not_ready_reason())

    def validate(self, request: GenerationRequest) -> None:
        if request.temperature is not None and request.temperature > 5:
            raise EngineRequestError("Invalid sampling parameters: temperature too high for the fake", "temperature")

    def unfinished_requests(self) -> dict[str, int]:
        return {"main": self.running}

    async def live_state(self, timeout: float = 5.0) -> dict[str, dict[str, int]]:
        return {"main": {"unfinished_requests": self.running}}

    async def generate(self, prompt: Sequence[int], request: GenerationRequest, request_id: str,
                       role: Any = None) -> AsyncIterator[Generation]:
        self.check_ready()
        self.validate(request)
        self.requests.append((list(prompt), request))
        if self.refuse is not None:
            raise self.refuse
        reply = self.tokenizer.encode(REPLY)
        tokens = [reply[i % len(reply)] for i in range(request.max_tokens)]
        finished = False
        self.running += 1
        try:
            if request.stream:
                for step, token in enumerate(tokens):
                    if self.fail_after is not None and step == self.fail_after[0]:
                        raise self.fail_after[1]
                    last = step == len(tokens) - 1
                    yield self._output(prompt, [token], request, last, cached=step == 0)
                    finished = last
                    if self.delay:
                        await asyncio.sleep(self.delay)
            else:
                await asyncio.sleep(self.delay)
                yield self._output(prompt, tokens, request, True, cached=True)
                finished = True
        finally:
            self.running -= 1
            if not finished:
                self.aborted += 1

    async def export(self, prompt: Sequence[int], request: GenerationRequest, request_id: str) -> list[ExportPosition]:
        self.requests.append((list(prompt), request))
        k = request.export_top_k or 1
        out = []
        for index in range(1, len(prompt)):
            ids = tuple(sorted({prompt[index], *range(k)})[:k])
            logprobs = tuple(math.log(1 / len(ids)) for _ in ids)
            hit = prompt[index] in ids
            out.append(ExportPosition(index, prompt[index], ids, logprobs, logprobs[0] if hit else None,
                                      1 if hit else None))
        return out

    async def top_logprobs(self, token_ids: Sequence[int], k: int, request_id: str,
                           cache_salt: str | None = None) -> list[tuple[int, float]]:
        weights = [2.0 ** -(i + 1) for i in range(k)]
        return [((token_ids[-1] + i + 1) % len(self.tokenizer), math.log(w)) for i, w in enumerate(weights)]

    # --- helpers -----------------------------------------------------------------------------------

    def _output(self, prompt: Sequence[int], tokens: list[int], request: GenerationRequest, last: bool,
                cached: bool) -> Generation:
        completions = []
        for index in range(request.n):
            logprobs = None
            if request.logprobs is not None:
                logprobs = tuple(self._logprobs(t, request.logprobs) for t in tokens)
            prediction = None
            if request.prediction is not None and last:
                prediction = PredictionCounts(drafted=len(request.prediction.token_ids), accepted=len(tokens))
            completions.append(CompletionDelta(index, self.tokenizer.decode(tokens), tuple(tokens),
                                               "length" if last else None, logprobs, prediction))
        prompt_logprobs = None
        if request.prompt_logprobs is not None and cached:  # the first output carries them, as vLLM's does
            prompt_logprobs = tuple(self._logprobs(t, request.prompt_logprobs) for t in prompt[1:])
        return Generation(tuple(completions), last, min(len(prompt), 16) if cached else None, prompt_logprobs)

    def _logprobs(self, token: int, top_n: int) -> TokenLogprobs:
        chosen = Candidate(token, self.tokenizer.decode([token]), math.log(0.5), 1)
        others = [Candidate(t, self.tokenizer.decode([t]), math.log(0.25 / (i + 1)), i + 2)
                  for i, t in enumerate(t for t in range(2, 2 + top_n + 1) if t != token)][:top_n]
        ranked = sorted([chosen, *others], key=lambda c: -c.logprob)
        return TokenLogprobs(token, chosen.token, chosen.logprob, tuple(ranked), 1)
