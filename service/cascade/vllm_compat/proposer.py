"""vLLM ``custom_class`` speculative proposer that drafts from each request's own prediction.

Per-request state lives here (inside the engine's worker process), keyed by request id and
created from ``SamplingParams.extra_args["cascade_prediction"]`` (``request_keys.prediction_extra_args``);
the pure algorithm is ``cascade.predict.static_text.PredictionState``. vLLM loads the class by its
dotted path (``PROPOSER``, the ``custom_class`` speculative model). It learns each row's request
from ``bind_batch``, which ``bind_batch_hook`` calls before every ``propose``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cascade.predict.code_datastore import CodeDatastore
from cascade.predict.datastore_corpus import DEFAULT_MIB, datastore_for
from cascade.predict.debug_log import PredictionDebugLog
from cascade.predict.draft_length import ConfidenceLength, DraftLength, FixedLength
from cascade.predict.response_cache import ResponseCache
from cascade.predict.static_text import PredictionState
from cascade.predict.usage import FinishedLedgers, PredictionLedger, external_id
from cascade.predict.vocabulary import TokenizerVocabulary, text_of, token_pieces
from cascade.vllm_compat.request_keys import (
    DATASTORE_DIR_KEY,
    DATASTORE_MIB_KEY,
    DRAFT_CROWDING_KEY,
    RESPONSE_CACHE_KEY,
    prediction_spec,
)
from cascade.vllm_compat.version import IncompatibleVllmError

PROPOSER = "cascade.vllm_compat.proposer.StaticTextProposer"
ROUND_TRIP_SAMPLE = "def f(x_1, naïve):\n\treturn {'k': [x_1 ** 2]}  # ok → é\r\n"
logger = logging.getLogger("cascade.predict.proposer")


def tokenizer_vocabulary(tokenizer: Any) -> TokenizerVocabulary:
    """The proposer's view of a Hugging Face tokenizer: token bytes and a plain text encoder.

    The spellings are checked on a sample: when they do not spell the tokenizer's own decoding
    (an unknown vocabulary format), each token's decoding is used instead (exact for any text whose
    characters each fit in one token)."""
    size = len(tokenizer)
    spelled = tokenizer.convert_ids_to_tokens(list(range(size)))
    specials = tokenizer.all_special_ids

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    vocab = TokenizerVocabulary(token_pieces(spelled, specials), encode)
    sample = ROUND_TRIP_SAMPLE.encode()
    if text_of(vocab, encode(ROUND_TRIP_SAMPLE)) != sample:
        logger.warning("token spellings do not round-trip; predictions follow each token's decoding")
        special = set(specials)
        pieces = [b"" if t in special else tokenizer.decode([t]).encode() for t in range(size)]
        vocab = TokenizerVocabulary(pieces, encode)
    return vocab


def is_sampled(params: Any) -> bool:
    """Whether vLLM samples this request (temperature above its greedy threshold) rather than taking
    the most likely token; unknown parameters count as sampled, the cautious side."""
    from vllm.sampling_params import SamplingType

    return getattr(params, "sampling_type", SamplingType.RANDOM) != SamplingType.GREEDY


class StaticTextProposer:
    """Drafts the next ≤ K predicted tokens for every row whose request carries a prediction."""

    def __init__(self, vllm_config: Any) -> None:
        from vllm.tokenizers import get_tokenizer

        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        model_config = vllm_config.model_config
        tokenizer = get_tokenizer(model_config.tokenizer, trust_remote_code=model_config.trust_remote_code)
        self.vocab = tokenizer_vocabulary(tokenizer)
        self.states: dict[str, PredictionState] = {}
        self.scopes: dict[str, str] = {}
        extra = getattr(vllm_config, "additional_config", None) or {}
        self.responses = ResponseCache(int(extra.get(RESPONSE_CACHE_KEY, 0)))
        self.crowding = float(extra.get(DRAFT_CROWDING_KEY, ConfidenceLength.CROWDING))
        self.datastore = self._load_datastore(extra)
        self.logs: dict[str, PredictionDebugLog] = {}
        self.ledgers: dict[str, PredictionLedger] = {}
        self.finished_ledgers = FinishedLedgers()
        self._rows: list[str] = []
        self._requests: Mapping[str, Any] = {}
        self._bound = False

    def _load_datastore(self, extra: Mapping[str, Any]) -> CodeDatastore | None:
        """The code datastore for this tokenizer; a failure to build it costs drafts, never the engine."""
        directory = extra.get(DATASTORE_DIR_KEY)
        try:
            return datastore_for(self.vocab, int(extra.get(DATASTORE_MIB_KEY, DEFAULT_MIB)),
                                 Path(directory) if directory else None)
        except Exception:
            logger.warning("no code datastore: predictions draft from the request only", exc_info=True)
            return None

    def bind_batch(self, req_ids: list[str], requests: Mapping[str, Any]) -> None:
        """Called by the hook before each ``propose``: row → request id, and live requests. Arms the
        next ``propose`` (which refuses to run unarmed)."""
        self._rows = req_ids
        self._requests = requests
        self._bound = True

    def _state(self, req_id: str, token_ids_cpu: Any, row: int) -> PredictionState | None:
        """The request's state, created on its first step from its prediction and its prompt's tokens
        (the request's own ``prompt_token_ids``, else the first ``num_prompt_tokens`` of its row)."""
        state = self.states.get(req_id)
        if state is not None:
            return state
        request = self._requests.get(req_id)
        spec = prediction_spec(getattr(request, "sampling_params", None))
        if not spec:
            return None
        prompt = getattr(request, "prompt_token_ids", None)
        if prompt is None and token_ids_cpu is not None:
            prompt = token_ids_cpu[row][:int(getattr(request, "num_prompt_tokens", 0) or 0)]
        scope = str(spec.get("scope", ""))
        params = getattr(request, "sampling_params", None)
        sampled = is_sampled(params)
        # a seeded sample depends on the drafts: only the request's own may shape them, so it repeats
        # (no earlier responses or other code, and drafts as long as alone however many requests share
        # its steps)
        seeded = sampled and getattr(params, "seed", None) is not None
        responses = None if seeded else self.responses.source(scope)
        datastore = None if seeded else self.datastore
        # adaptive requests draft as ``PredictionState``'s default does (what ``simulate`` runs), with
        # the configured crowding (one request alone drafts alike whatever it is)
        crowding = 0.0 if seeded else self.crowding
        adaptive = spec.get("adaptive", True)
        lengths: DraftLength = ConfidenceLength(self.k, crowding=crowding) if adaptive else FixedLength(self.k)
        state = PredictionState(spec["ids"], self.vocab, mode=spec.get("mode", "smart"), lengths=lengths,
                                prompt_ids=[int(t) for t in (prompt if prompt is not None else ())], k=self.k,
                                sampled=sampled, responses=responses, datastore=datastore)
        self.states[req_id] = state
        self.scopes[req_id] = scope
        self.ledgers[req_id] = PredictionLedger()
        log = PredictionDebugLog.open(req_id)
        if log is not None:
            self.logs[req_id] = log
        return state

    def release_finished(self) -> int:
        """Drop the state of every request the runner no longer holds; returns how many.

        ``requests`` is the runner's own dict (bound by reference), so this is right at any time:
        before each ``propose`` and when the gateway counts live state (a request that finishes in
        the batch's last step is otherwise only forgotten at the next ``propose``).
        """
        finished = [r for r in self.states if r not in self._requests]
        finished += [r for r in self.logs if r not in self._requests and r not in self.states]
        for req_id in finished:
            state = self.states.pop(req_id, None)
            scope = self.scopes.pop(req_id, "")
            if state is not None:
                self.responses.add(scope, state.output_tokens)
            ledger = self.ledgers.pop(req_id, None)
            if ledger is not None:
                self.finished_ledgers.put(external_id(req_id), ledger)
            log = self.logs.pop(req_id, None)
            if log is not None:
                log.close()
        return len(finished)

    def _tokens_left(self, req_id: str, total: int) -> int:
        """Completion tokens the request may still produce. A draft longer than that minus one (the
        step's own token) would be verified, counted as accepted and then cut off by ``max_tokens``."""
        request = self._requests.get(req_id)
        max_tokens = getattr(getattr(request, "sampling_params", None), "max_tokens", None)
        prompt = getattr(request, "num_prompt_tokens", None)
        if max_tokens is None or prompt is None:
            return self.max_model_len
        return int(max_tokens) - (total - int(prompt))

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: Any, token_ids_cpu: Any,
                slot_mappings: Any = None) -> list[list[int]]:
        if not self._bound:
            raise IncompatibleVllmError(
                "StaticTextProposer.propose was called without bind_batch for this step: the bind_batch hook "
                "no longer fires before propose (GPUModelRunner.propose_draft_token_ids changed, or the hook "
                "was not installed with the cascade_install_hooks RPC)")
        self._bound = False
        self.release_finished()
        drafts: list[list[int]] = []
        rows = sum(1 for sampled in sampled_token_ids if sampled)  # requests this step verifies
        for row, sampled in enumerate(sampled_token_ids):
            req_id = self._rows[row] if row < len(self._rows) else None
            state = self._state(req_id, token_ids_cpu, row) if req_id is not None else None
            if req_id is None or state is None or not sampled:
                drafts.append([])
                continue
            # the ledger counts drafts from the prediction only: drafts copied from the prompt or the
            # output are not prediction tokens (``PredictionState`` keeps them per source)
            drafted = len(state.last_proposal) if state.last_source == "prediction" else 0
            accepted = state.prediction_accepted
            state.observe(list(sampled))
            self.ledgers[req_id].record(len(sampled), drafted, state.prediction_accepted - accepted)
            total = int(num_tokens_no_spec[row])
            draft = state.propose(max(0, min(self.k, self.max_model_len - total - 1,
                                             self._tokens_left(req_id, total) - 1)), rows)
            drafts.append(draft)
            log = self.logs.get(req_id)
            if log is not None:
                log.write({"sampled": list(sampled), "draft": draft, **state.snapshot()})
        return drafts

    def prediction_usage(self, request_id: str, answer_tokens: int) -> tuple[int, int] | None:
        """(drafted, accepted) prediction tokens within the first ``answer_tokens`` tokens of the
        output of the request the gateway calls ``request_id``; None when it is unknown here."""
        self.release_finished()
        ledger = self.finished_ledgers.pop(request_id)
        if ledger is None:
            ledger = next((self.ledgers[r] for r in self.ledgers if external_id(r) == request_id), None)
        return None if ledger is None else ledger.counts(answer_tokens)

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: the drafts come from the request's own text."""
