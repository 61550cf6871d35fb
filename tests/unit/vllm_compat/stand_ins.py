"""Stand-in vLLM model runners: plain classes with the attributes Cascade's hooks read, small tensors."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

VOCAB = 6
HIDDEN = 4


class StandInModel:
    def __init__(self, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.weight = torch.randn(VOCAB, HIDDEN, generator=generator)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states @ self.weight.T


def request(prompt: Sequence[int], params: Any, num_computed_tokens: int = 0) -> SimpleNamespace:
    return SimpleNamespace(prompt_token_ids=list(prompt), sampling_params=params,
                           num_computed_tokens=num_computed_tokens, in_progress_prompt_logprobs_cpu=None)


class StandInRunner:
    """Like vLLM 0.32's ``GPUModelRunner`` for prompt logprobs: one ``compute_logits`` per request on a
    view of the step's hidden states starting at the request's ``query_start_loc``."""

    def __init__(self, requests: dict[str, SimpleNamespace], scheduled: dict[str, int], k: int = 4) -> None:
        self.requests = requests
        self.num_prompt_logprobs = {req_id: k for req_id in requests}
        order = list(requests)
        self.input_batch = SimpleNamespace(req_id_to_index={r: i for i, r in enumerate(order)}, req_ids=order)
        starts = np.cumsum([0] + [scheduled[r] for r in order])
        self.query_start_loc = SimpleNamespace(np=starts)
        self.model = StandInModel()
        self.scheduled = scheduled

    def hidden_states(self) -> torch.Tensor:
        total = int(sum(self.scheduled.values()))
        return torch.randn(total, HIDDEN, generator=torch.Generator().manual_seed(1))

    def prompt_slice(self, hidden_states: torch.Tensor, offset: int, n: int) -> torch.Tensor:
        return hidden_states[offset:offset + n]

    def _get_prompt_logprobs_dict(self, hidden_states: torch.Tensor,
                                  num_scheduled_tokens: dict[str, int]) -> dict[str, torch.Tensor]:
        out = {}
        for req_id in self.num_prompt_logprobs:
            num_tokens = num_scheduled_tokens.get(req_id)
            if num_tokens is None:
                continue
            req = self.requests[req_id]
            num_logits = min(num_tokens, len(req.prompt_token_ids) - req.num_computed_tokens - 1)
            if num_logits <= 0:
                continue
            offset = int(self.query_start_loc.np[self.input_batch.req_id_to_index[req_id]])
            out[req_id] = self.model.compute_logits(self.prompt_slice(hidden_states, offset, num_logits))
        return out


class CopyingRunner(StandInRunner):
    """A changed vLLM: prompt logits computed on a copy of the hidden states, not a view."""

    def prompt_slice(self, hidden_states: torch.Tensor, offset: int, n: int) -> torch.Tensor:
        return hidden_states[offset:offset + n].clone()


class BatchedRunner(StandInRunner):
    """A changed vLLM: one ``compute_logits`` over every row of the step, then sliced."""

    def _get_prompt_logprobs_dict(self, hidden_states: torch.Tensor,
                                  num_scheduled_tokens: dict[str, int]) -> dict[str, torch.Tensor]:
        logits = self.model.compute_logits(hidden_states)
        out = {}
        for req_id in self.num_prompt_logprobs:
            req = self.requests[req_id]
            offset = int(self.query_start_loc.np[self.input_batch.req_id_to_index[req_id]])
            n = min(num_scheduled_tokens[req_id], len(req.prompt_token_ids) - req.num_computed_tokens - 1)
            out[req_id] = logits[offset:offset + n]
        return out


class DraftingRunner:
    """Like vLLM 0.32's runner for a ``custom_class`` proposer."""

    def __init__(self, drafter: Any, requests: dict[str, Any]) -> None:
        self.drafter = drafter
        self.requests = requests
        self.input_batch = SimpleNamespace(req_ids=list(requests), num_tokens_no_spec=np.zeros(len(requests)),
                                           token_ids_cpu=None)

    def propose_draft_token_ids(self, scheduler_output: Any, sampled_token_ids: list[list[int]],
                                *args: Any) -> list[list[int]]:
        return self.drafter.propose(sampled_token_ids, self.input_batch.num_tokens_no_spec,
                                    self.input_batch.token_ids_cpu, slot_mappings=None)

    def _input_fits_in_drafter(self, common_attn_metadata: Any) -> bool:
        """vLLM's rule: the batch's longest row plus K within ``max_model_len`` (1,024 here, K = 64)."""
        return common_attn_metadata is not None and common_attn_metadata.max_seq_len + 64 <= 1024


def fresh(cls: type) -> type:
    """A subclass to install hooks on, so each test patches its own class."""
    return type(f"Fresh{cls.__name__}", (cls,), {})


def toy_proposer(monkeypatch: Any, vocabulary: Any, k: int, response_cache_tokens: int = 0,
                 crowding: float = 0.5, datastore: Any = None) -> Any:
    """The real ``StaticTextProposer`` over a toy vocabulary (no tokenizer is loaded), drafting ≤ ``k``,
    keeping ``response_cache_tokens`` of earlier responses, with the given draft ``crowding`` and code
    ``datastore`` (a toy vocabulary has none of its own)."""
    import pytest
    from cascade.vllm_compat.proposer import StaticTextProposer
    from cascade.vllm_compat.request_keys import DRAFT_CROWDING_KEY, RESPONSE_CACHE_KEY

    vllm_tokenizers = pytest.importorskip("vllm.tokenizers")
    monkeypatch.setattr(vllm_tokenizers, "get_tokenizer", lambda *a, **kw: None)
    monkeypatch.setattr("cascade.vllm_compat.proposer.tokenizer_vocabulary", lambda tokenizer: vocabulary)
    if datastore is not None:
        monkeypatch.setattr("cascade.vllm_compat.proposer.datastore_for", lambda *args: datastore)
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=k),
                             model_config=SimpleNamespace(max_model_len=256, tokenizer="toy", trust_remote_code=False),
                             additional_config={RESPONSE_CACHE_KEY: response_cache_tokens,
                                                DRAFT_CROWDING_KEY: crowding})
    return StaticTextProposer(config)
