"""Owns the vLLM ``AsyncLLM`` engines: start, readiness, generation with abort, shutdown."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cascade.engine.config import EngineRole, engine_kwargs, engine_roles
from cascade.engine.fingerprint import model_fingerprint
from cascade.engine.worker_state import RPC_METHOD, WORKER_EXTENSION, merge_counts
from cascade.settings import Settings

if TYPE_CHECKING:
    from vllm import RequestOutput, SamplingParams
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
    _ready: asyncio.Event = field(default_factory=asyncio.Event)
    _tokenizer: Any = None

    def roles(self) -> list[EngineRole]:
        """The engine roles this configuration runs."""
        return engine_roles(self.settings)

    async def start(self) -> None:
        """Start every engine; on failure record why and leave ``ready`` false."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from cascade.plugin import check_vllm_version

        t0 = time.monotonic()
        try:
            check_vllm_version()
            self.fingerprint = await asyncio.to_thread(model_fingerprint, self.settings.model)

            async def start_one(role: EngineRole) -> None:
                args = AsyncEngineArgs(**engine_kwargs(self.settings, role), worker_extension_cls=WORKER_EXTENSION)
                self.engines[role] = await asyncio.to_thread(AsyncLLM.from_engine_args, args)
                logger.info("engine started", extra={"role": role.value, "seconds": time.monotonic() - t0})

            await asyncio.gather(*(start_one(role) for role in self.roles()))
            self._tokenizer = self.engines[EngineRole.MAIN].get_tokenizer()
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

    def not_ready_reason(self) -> str:
        """Human-readable reason for ``ready`` being false."""
        if self.start_error:
            return f"engine failed to start: {self.start_error}"
        if not self._ready.is_set():
            return "engine is starting"
        dead = [role.value for role, engine in self.engines.items() if engine.errored]
        return f"engine died ({', '.join(dead)}); the service must be restarted"

    def engine(self, role: EngineRole = EngineRole.MAIN) -> AsyncLLM:
        """The engine for a role, or ``EngineNotReadyError``."""
        if not self.ready:
            raise EngineNotReadyError(self.not_ready_reason())
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
            per_worker = await asyncio.wait_for(engine.collective_rpc(RPC_METHOD), timeout)
            counts = merge_counts(list(per_worker))
            counts["unfinished_requests"] = engine.get_num_unfinished_requests()
            return role.value, counts

        live = [(role, engine) for role, engine in self.engines.items() if not engine.errored]
        return dict(await asyncio.gather(*(one(role, engine) for role, engine in live)))

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        request_id: str,
        role: EngineRole = EngineRole.MAIN,
    ) -> AsyncIterator[RequestOutput]:
        """Stream outputs; cancelling the consumer aborts the request inside the engine.

        Closing vLLM's stream aborts by its internal, randomised id: ``engine.abort(request_id)``
        would abort every request sharing the external id, not only this one."""
        engine = self.engine(role)
        finished = False
        stream = engine.generate({"prompt_token_ids": list(prompt_token_ids)}, params, request_id)
        try:
            async for output in stream:
                finished = output.finished
                yield output
        finally:
            if not finished and not engine.errored:
                await stream.aclose()

    def shutdown(self) -> None:
        """Stop every engine process; safe to call twice."""
        for role, engine in list(self.engines.items()):
            try:
                engine.shutdown()
            except Exception:
                logger.exception("engine shutdown failed", extra={"role": role.value})
        self.engines.clear()
        self._ready.clear()
