"""The gateway's engine adapter: owns the vLLM ``AsyncLLM`` engines (start, readiness, shutdown) and
serves Cascade's requests on them in Cascade's types (``cascade.engine.types``), so no route sees a
vLLM object. Every engine is checked at start-up: the vLLM surface Cascade relies on
(``vllm_compat.contract``), the in-engine hooks its role needs (installed by RPC, each checking the
live runner first), and a probe request per hook proving it took effect."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from cascade.engine import outputs
from cascade.engine.config import ROLE_HOOKS, EngineRole, engine_kwargs, engine_roles
from cascade.engine.fingerprint import model_fingerprint
from cascade.engine.params import sampling_params, top_logprobs_params, translate_error
from cascade.engine.types import Generation, GenerationRequest, PredictionCounts
from cascade.export.topk import ExportPosition
from cascade.settings import Settings
from cascade.vllm_compat.engine_stop import cancel_output_readers
from cascade.vllm_compat.worker_extension import (
    LIVE_STATE_RPC,
    PREDICTION_USAGE_RPC,
    WORKER_EXTENSION,
    install_engine_hooks,
    merge_counts,
)

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

logger = logging.getLogger("cascade.engine")


class EngineNotReadyError(RuntimeError):
    """No engine can take the request (still starting, failed, or dead)."""


@dataclass
class EngineManager:
    """Starts the engines a configuration needs and hands requests to the right one.

    Engines start in a worker thread so the HTTP server answers ``/health`` (and ``/ready`` = 503)
    while weights load. ``start_error`` keeps the reason a start failed, for ``/ready``.
    """

    settings: Settings
    engines: dict[EngineRole, AsyncLLM] = field(default_factory=dict)
    start_error: str | None = None
    fingerprint: bytes = b""
    started_at: float = 0.0
    aborted: int = 0
    eos_token_ids: frozenset[int] = frozenset()  # every id a generation ends on (k-CBS blocks them all)
    _ready: asyncio.Event = field(default_factory=asyncio.Event)
    _tokenizer: Any = None
    _probe_task: asyncio.Task[Any] | None = None

    def roles(self) -> list[EngineRole]:
        """The engine roles this configuration runs."""
        return engine_roles(self.settings)

    async def start(self) -> None:
        """Start every engine; on failure record why and leave ``ready`` false."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from cascade.vllm_compat.contract import require_compatible
        from cascade.vllm_compat.version import check_vllm_version

        t0 = time.monotonic()
        try:
            check_vllm_version()
            await asyncio.to_thread(require_compatible)  # imports vLLM's model runner: off the event loop
            self.fingerprint = await asyncio.to_thread(model_fingerprint, self.settings.model)

            async def start_one(role: EngineRole) -> None:
                args = AsyncEngineArgs(**engine_kwargs(self.settings, role), worker_extension_cls=WORKER_EXTENSION)
                engine = self.engines[role] = await asyncio.to_thread(AsyncLLM.from_engine_args, args)
                await install_engine_hooks(engine, list(ROLE_HOOKS[role]))
                logger.info("engine started", extra={"role": role.value, "seconds": time.monotonic() - t0})

            await asyncio.gather(*(start_one(role) for role in self.roles()))
            self._tokenizer = self.engines[EngineRole.MAIN].get_tokenizer()
            self.eos_token_ids = end_of_sequence_ids(self._tokenizer, self.engines[EngineRole.MAIN])
            await probe_hooks(self)
            self.started_at = time.time()
            self._ready.set()
        except Exception as exc:
            self.start_error = f"{type(exc).__name__}: {exc}"
            logger.exception("engine start failed")
            raise

    @property
    def ready(self) -> bool:
        """True once every engine started and none has died."""
        return self._ready.is_set() and not any(engine.errored for engine in self.engines.values())

    @property
    def dead(self) -> bool:
        """Some engine started and has since died."""
        return any(engine.errored for engine in self.engines.values())

    def not_ready_reason(self) -> str:
        """Human-readable reason for ``ready`` being false."""
        if self.start_error:
            return f"engine failed to start: {self.start_error}"
        if not self._ready.is_set():
            return "engine is starting"
        dead = [role.value for role, engine in self.engines.items() if engine.errored]
        return f"engine died ({', '.join(dead)}); the service must be restarted"

    def check_ready(self) -> None:
        """``EngineNotReadyError`` unless every engine is up."""
        if not self.ready:
            raise EngineNotReadyError(self.not_ready_reason())

    def _engine(self, role: EngineRole) -> AsyncLLM:
        """The role's engine; before ``ready`` only the start-up probes (run by ``start``'s task) get it."""
        if self._probe_task is None or asyncio.current_task() is not self._probe_task:
            self.check_ready()
        return self.engines[role]

    @property
    def tokenizer(self) -> Any:
        """The engine's Hugging Face tokenizer (loaded in this process)."""
        if self._tokenizer is None:
            raise EngineNotReadyError(self.not_ready_reason())
        return self._tokenizer

    def unfinished_requests(self) -> dict[str, int]:
        """Requests each engine still holds (queued or running)."""
        return {role.value: engine.get_num_unfinished_requests() for role, engine in self.engines.items()}

    async def live_state(self, timeout: float = 5.0) -> dict[str, dict[str, int]]:
        """Per engine: unfinished requests plus the per-request state its worker holds (vLLM's and
        Cascade's prediction states; see ``worker_state``). Dead engines are skipped."""
        async def one(role: EngineRole, engine: AsyncLLM) -> tuple[str, dict[str, int]]:
            per_worker = await asyncio.wait_for(engine.collective_rpc(LIVE_STATE_RPC), timeout)
            counts = merge_counts(list(per_worker))
            counts["unfinished_requests"] = engine.get_num_unfinished_requests()
            return role.value, counts

        live = [(role, engine) for role, engine in self.engines.items() if not engine.errored]
        return dict(await asyncio.gather(*(one(role, engine) for role, engine in live)))

    def validate(self, request: GenerationRequest) -> None:
        """Raise the engine's ``EngineRequestError`` for parameters it would refuse, before any
        response starts (the engine itself only checks when it admits the request)."""
        sampling_params(request, len(self.tokenizer))

    async def generate(self, prompt_token_ids: Sequence[int], request: GenerationRequest, request_id: str,
                       role: EngineRole = EngineRole.MAIN) -> AsyncIterator[Generation]:
        """Stream a request's outputs; cancelling or closing the consumer aborts it in the engine."""
        params = sampling_params(request, len(self.tokenizer))
        answer_tokens = 0
        async for output in self._outputs(prompt_token_ids, params, request_id, role, request.cache_salt):
            generation = outputs.generation(output)
            if request.prediction is not None:
                answer_tokens = sum(len(c.token_ids) for c in generation.completions) + (
                    answer_tokens if request.stream else 0)
                if generation.finished:
                    generation = await self._with_prediction_usage(generation, request_id, answer_tokens, role)
            yield generation

    async def _with_prediction_usage(self, generation: Generation, request_id: str, answer_tokens: int,
                                      role: EngineRole, timeout: float = 10.0) -> Generation:
        """The finished generation with the prediction tokens drafted and accepted within its answer,
        from the proposer's ledger (``cascade.predict.usage``): vLLM's summary counts steps the engine
        ran past a stop string, or is missing when the stop was found first."""
        engine = self._engine(role)
        try:
            per_worker = await asyncio.wait_for(
                engine.collective_rpc(PREDICTION_USAGE_RPC, args=(request_id, answer_tokens)), timeout)
        except Exception:
            logger.warning("prediction usage unavailable", extra={"request_id": request_id}, exc_info=True)
            return generation
        found = next((usage for usage in per_worker if usage is not None), None)
        if found is None:
            return generation
        drafted, accepted = found
        counts = PredictionCounts(drafted=int(drafted), accepted=int(accepted))
        return replace(generation, completions=tuple(replace(c, prediction=counts) for c in generation.completions))

    async def export(self, prompt: Sequence[int], request: GenerationRequest, request_id: str) -> list[ExportPosition]:
        """The teacher-forced, processed top-``request.export_top_k`` distribution of every prompt position."""
        assert request.export_top_k is not None
        params = sampling_params(request, len(self.tokenizer))
        final = None
        async for output in self._outputs(prompt, params, request_id, EngineRole.MAIN, request.cache_salt):
            if output.prompt_logprobs is not None:
                final = output
        return await asyncio.to_thread(outputs.export_positions, prompt, final, request.export_top_k)

    async def top_logprobs(self, token_ids: Sequence[int], k: int, request_id: str,
                           cache_salt: str | None = None) -> list[tuple[int, float]]:
        """The model's ``k`` most likely next tokens after ``token_ids`` with their raw log-probabilities."""
        final = None
        async for output in self._outputs(token_ids, top_logprobs_params(k), request_id, EngineRole.MAIN, cache_salt):
            final = output
        return outputs.top_logprobs(final)

    async def _outputs(self, prompt_token_ids: Sequence[int], params: SamplingParams, request_id: str,
                       role: EngineRole, cache_salt: str | None = None) -> AsyncIterator[Any]:
        """vLLM's outputs with its errors translated. Closing vLLM's stream aborts by its internal,
        randomised id: ``engine.abort(request_id)`` would abort every request sharing the external id."""
        engine = self._engine(role)
        finished = False
        prompt: dict[str, Any] = {"prompt_token_ids": list(prompt_token_ids)}
        if cache_salt is not None:
            prompt["cache_salt"] = cache_salt
        stream = engine.generate(prompt, params, request_id)
        try:
            async for output in stream:
                finished = output.finished
                yield output
        except Exception as exc:
            error = translate_error(exc)
            if error is None:
                raise
            raise error from exc
        finally:
            if not finished and not engine.errored:
                self.aborted += 1
                await stream.aclose()

    async def close(self) -> None:
        """Stop every engine: first each engine's output reader, on this loop (``engine_stop`` says
        why), then the processes (``shutdown``, in a thread)."""
        await cancel_output_readers(self.engines.values())
        await asyncio.to_thread(self.shutdown)

    def shutdown(self) -> None:
        """Stop every engine process; safe to call twice."""
        for role, engine in list(self.engines.items()):
            try:
                engine.shutdown()
            except Exception:
                logger.exception("engine shutdown failed", extra={"role": role.value})
        self.engines.clear()
        self._ready.clear()


def end_of_sequence_ids(tokenizer: Any, engine: Any) -> frozenset[int]:
    """Every id on which the engine ends a generation: the tokenizer's EOS and those of the model's
    generation config (vLLM stops on both; a chat model often ends its turns with another token
    than the document's EOS, and some list several)."""
    ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    try:
        configured = engine.model_config.try_get_generation_config().get("eos_token_id")
    except Exception:  # a model without a readable generation config ends on the tokenizer's EOS only
        configured = None
    for value in configured if isinstance(configured, list) else [configured]:
        if isinstance(value, int):
            ids.add(value)
    return frozenset(ids)


async def probe_hooks(engines: EngineManager) -> None:
    """Prove each installed hook takes effect before the service reports ready.

    Each probe asks for something only the hook can deliver, whatever the dtype or the host's
    numerics: an export restricted to two allowed tokens must return only those at every position
    (raw prompt logprobs would name four tokens from the whole vocabulary; a ``top_k`` probe would
    not do, tied logits legitimately keep more than ``k``); a prediction must be drafted from (the
    bind-batch hook told the proposer which request sits in each row)."""
    from cascade.engine.types import Prediction
    from cascade.vllm_compat.version import IncompatibleVllmError

    engines._probe_task = asyncio.current_task()
    try:
        prompt = list(engines.tokenizer.encode("def add(a, b):\n    return a + b\n", add_special_tokens=False))
        allowed = tuple(sorted(set(prompt)))[:2]
        try:
            positions = await engines.export(prompt, GenerationRequest(max_tokens=1, allowed_token_ids=allowed,
                                                                       export_top_k=4), "cascade-probe-export")
        except Exception as exc:
            raise IncompatibleVllmError(f"the start-up probe of the top-k export (prompt log-probabilities through "
                                        f"the export hook) failed: {type(exc).__name__}: {exc}") from exc
        problem = export_probe_problem(positions, len(prompt), allowed)
        if problem:
            raise IncompatibleVllmError(f"the top-k export hook did not process the prompt logits ({problem}): "
                                        f"vLLM's prompt-logprobs path changed")
        if EngineRole.PREDICT in engines.engines:
            greedy = GenerationRequest(max_tokens=8, temperature=0.0, ignore_eos=True)
            drafted = 0
            tokens: tuple[int, ...] = ()
            async for out in engines.generate(prompt[:4], greedy, "cascade-probe-greedy"):
                tokens = out.completions[0].token_ids
            predicted = GenerationRequest(max_tokens=8, temperature=0.0, ignore_eos=True,
                                          prediction=Prediction(tuple(tokens)))
            async for out in engines.generate(prompt[:4], predicted, "cascade-probe-predict", EngineRole.PREDICT):
                counts = out.completions[0].prediction
                drafted += counts.drafted if counts is not None else 0
            if not drafted:
                raise IncompatibleVllmError("the static-text proposer drafted nothing for a request carrying a "
                                            "prediction: the bind-batch hook or vLLM's custom_class proposer API "
                                            "changed")
    finally:
        engines._probe_task = None


def export_probe_problem(positions: Sequence[ExportPosition], prompt_length: int, allowed: Sequence[int]) -> str:
    """What is wrong with the export probe's answer (empty: the hook processed every position).

    The probe exports with ``allowed_token_ids`` set to ``allowed``: processed logits leave only
    those finite, raw ones would rank tokens from the whole vocabulary."""
    if len(positions) != prompt_length - 1:
        return f"{len(positions)} positions came back for a {prompt_length}-token prompt"
    for position in positions:
        outside = sorted(set(position.ids) - set(allowed))
        if not position.ids or outside:
            return (f"position {position.index} holds token(s) {outside or '(none)'} although only "
                    f"{list(allowed)} were allowed")
    return ""
