"""The export's truncation shortcut keeps exactly what vLLM's own top-k/top-p/min-p masks keep."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from cascade.vllm_compat.export_processing import process_prompt_logits
from hypothesis import given, settings
from hypothesis import strategies as st


def vllm_reference(logits: torch.Tensor, params: SimpleNamespace) -> torch.Tensor:
    """vLLM's sampler order with its own top-k/top-p function over the whole vocabulary."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    out = logits / params.temperature
    if params.min_p:
        probs = out.softmax(-1)
        out = out.masked_fill(probs < params.min_p * probs.amax(-1, keepdim=True), float("-inf"))
    rows = out.shape[0]
    k = torch.full((rows,), params.top_k, dtype=torch.long) if params.top_k else None
    p = torch.full((rows,), params.top_p) if params.top_p < 1.0 else None
    return apply_top_k_top_p_pytorch(out, k, p)


def best(logits: torch.Tensor, keep: int) -> list[dict[int, float]]:
    """Each row's ``keep`` best finite tokens, renormalised (what an export returns)."""
    rows = []
    values, ids = logits.topk(keep, dim=-1)
    for row_values, row_ids in zip(values, ids, strict=True):
        finite = torch.isfinite(row_values)
        kept = row_values[finite].double()
        norm = torch.logsumexp(kept, 0)
        rows.append({int(t): float(v - norm) for t, v in zip(row_ids[finite], kept, strict=True)})
    return rows


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), temperature=st.sampled_from([0.5, 1.0, 1.7]),
       top_k=st.sampled_from([0, 1, 5, 50, 300]), top_p=st.sampled_from([1.0, 0.95, 0.6, 0.1]),
       min_p=st.sampled_from([0.0, 0.05]), keep=st.sampled_from([1, 20, 100]))
def test_truncation_matches_vllm_masks(seed: int, temperature: float, top_k: int, top_p: float, min_p: float,
                                       keep: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, 512, generator=generator) * 3
    params = SimpleNamespace(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                             allowed_token_ids=None, logit_bias=None, bad_words_token_ids=None)
    ours = best(process_prompt_logits(logits.clone(), params, [], 0, keep), keep)
    theirs = best(vllm_reference(logits.clone(), params), keep)
    for row_ours, row_theirs in zip(ours, theirs, strict=True):
        assert row_ours.keys() == row_theirs.keys()
        for token, value in row_theirs.items():
            assert row_ours[token] == pytest.approx(value, abs=1e-5)


def test_bias_allowed_tokens_and_bad_words_apply_per_position() -> None:
    logits = torch.zeros(3, 8)
    params = SimpleNamespace(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, allowed_token_ids=[1, 2, 3, 4],
                             logit_bias={4: 5.0}, bad_words_token_ids=[[7, 3], [2]])
    prompt = [5, 7, 6, 7]
    out = process_prompt_logits(logits, params, prompt, 1, 8)
    assert torch.isinf(out[:, [0, 5, 6, 7]]).all() and torch.isinf(out[:, 2]).all()
    assert out[0, 4] == 5.0
    assert torch.isinf(out[1, 3]) and torch.isfinite(out[0, 3]) and torch.isfinite(out[2, 3])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), top_k=st.sampled_from([0, 5, 50, 300]), top_p=st.sampled_from([1.0, 0.95, 0.6]),
       min_p=st.sampled_from([0.0, 0.01]), keep=st.sampled_from([1, 4]))
def test_a_surviving_target_beyond_the_kept_k_keeps_its_true_rank(seed: int, top_k: int, top_p: float, min_p: float,
                                                                 keep: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, 512, generator=generator) * 2
    targets = torch.randint(0, 512, (6,), generator=generator).tolist()
    params = SimpleNamespace(temperature=1.0, top_k=top_k, top_p=top_p, min_p=min_p,
                             allowed_token_ids=None, logit_bias=None, bad_words_token_ids=None)
    ours = process_prompt_logits(logits.clone(), params, targets, 0, keep)
    theirs = vllm_reference(logits.clone(), params)
    for row, target in enumerate(targets):
        survives = bool(torch.isfinite(theirs[row, target]))
        assert bool(torch.isfinite(ours[row, target])) == survives
        if survives:
            assert int((ours[row] > ours[row, target]).sum()) == int((theirs[row] > theirs[row, target]).sum())


def test_tokens_tied_with_the_kth_all_survive_top_k_as_in_vllm_sampler() -> None:
    """bf16 logits tie often: at top_k=2 three tokens tied for second place all stay in the sampler's
    distribution, so the export (the sampler's distribution) returns all four candidates."""
    logits = torch.full((2, 16), -4.0)
    logits[0, [9, 3, 12]] = 1.5
    logits[0, 7] = 3.0
    logits[1, [2, 5]] = 2.0
    params = SimpleNamespace(temperature=1.0, top_k=2, top_p=1.0, min_p=0.0,
                             allowed_token_ids=None, logit_bias=None, bad_words_token_ids=None)
    ours = process_prompt_logits(logits.clone(), params, [], 0, 4)
    theirs = vllm_reference(logits.clone(), params)
    assert torch.isfinite(ours).sum(dim=-1).tolist() == [4, 2]
    assert torch.equal(torch.isfinite(ours), torch.isfinite(theirs))


def test_top_p_after_a_tied_top_k_normalises_over_every_tied_token() -> None:
    logits = torch.full((1, 16), -30.0)
    logits[0, [1, 4, 6]] = 0.0
    params = SimpleNamespace(temperature=1.0, top_k=1, top_p=0.5, min_p=0.0,
                             allowed_token_ids=None, logit_bias=None, bad_words_token_ids=None)
    ours = process_prompt_logits(logits.clone(), params, [], 0, 4)
    assert torch.isfinite(ours).sum().item() == 2  # each tied token holds 1/3: the first two are needed for 0.5
