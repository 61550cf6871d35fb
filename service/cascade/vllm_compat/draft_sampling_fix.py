"""Make vLLM's rejection sampler see each request's own temperature, top-k and top-p on the CPU,
and survive a step that drafted nothing.

vLLM 0.32 spreads the per-request sampling parameters over the draft positions with
``rejection_sampler.expand_batch_to_tokens``. Without Triton (every CPU build) its kernel is
replaced by a C++ override that converts the output tensor to int64 before writing, so a float32
output (temperature, top-p) or an int32 one (top-k) is written into a temporary copy and the real
output keeps uninitialised memory. The target distribution of every drafted position is then scaled
by garbage: at any temperature above 0 a draft is judged against the wrong distribution, drafts are
rejected and the replacement tokens come from noise — a prediction changes what the model samples.

``install()`` replaces the module function with one written in plain torch (same contract: repeat
each request's value over its draft positions, ``replace_from`` → ``replace_to``) only when
``is_broken()`` shows the installed one drops values, so a vLLM that fixes the kernel is left alone
and a GPU build (whose Triton kernel is correct) is never touched.

vLLM 0.32 also runs the rejection sampler on every step of a speculative engine, drafts or not, and
on the CPU its top-k-only mask takes ``k.max()`` of the drafted positions' top-k: with no drafted
position in the step that is the maximum of an empty tensor, which raises in the worker and kills
the engine. A sampled request with ``top_k`` (and no ``top_p``) whose prediction gave no draft did
that. ``install()`` also wraps the sampler's ``apply_top_k_top_p`` so that zero rows come back as
they are (there is nothing to mask), again only when ``empty_step_fails()`` shows the installed one
raises on them.
"""

from __future__ import annotations

from typing import Any

from cascade.vllm_compat.version import IncompatibleVllmError

MODULE = "vllm.v1.sample.rejection_sampler"
FUNCTION = "expand_batch_to_tokens"
MASK = "apply_top_k_top_p"
_MARK = "_cascade_draft_sampling_fix"


def expand_batch_to_tokens(x: Any, cu_num_tokens: Any, num_tokens: int, replace_from: int = 0,
                           replace_to: int = 0) -> Any:
    """``x[i]`` repeated over request ``i``'s draft positions (``cu_num_tokens`` is cumulative), with
    values equal to ``replace_from`` replaced by ``replace_to``; dtype and device of ``x`` kept."""
    import torch

    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    values = torch.where(x == replace_from, torch.full_like(x, replace_to), x)
    return torch.repeat_interleave(values, counts, output_size=num_tokens)


def _module() -> Any:
    import importlib

    return importlib.import_module(MODULE)


def problems(function: Any | None = None) -> list[str]:
    """What the installed (or given) expansion gets wrong on a float32, an int32 and an int64 input."""
    import torch

    expand = function or getattr(_module(), FUNCTION)
    cu = torch.tensor([2, 2, 5], dtype=torch.int32)
    found = []
    for values in (torch.tensor([0.25, 0.5, 0.0]), torch.tensor([3, 0, 7], dtype=torch.int32),
                   torch.tensor([3, 0, 7], dtype=torch.int64)):
        want = expand_batch_to_tokens(values, cu, 5, replace_from=0, replace_to=1)
        got = expand(values, cu, 5, replace_from=0, replace_to=1)
        if got.dtype != want.dtype or not torch.equal(got, want):
            found.append(f"{values.dtype}: {got.tolist()} instead of {want.tolist()}")
    return found


def is_broken() -> bool:
    return bool(problems())


def empty_step_fails(function: Any | None = None) -> bool:
    """Whether the installed (or given) top-k/top-p mask raises on a step with no drafted positions."""
    import torch

    mask = function or getattr(_module(), MASK)
    for k, p in ((torch.empty(0, dtype=torch.int32), None), (None, torch.empty(0)),
                 (torch.empty(0, dtype=torch.int32), torch.empty(0))):
        try:
            mask(torch.empty(0, 8), k, p)
        except Exception:
            return True
    return False


def skipping_empty_steps(mask: Any) -> Any:
    """``mask`` that returns logits without rows as they are."""
    def apply_top_k_top_p(logits: Any, k: Any, p: Any) -> Any:
        if logits.shape[0] == 0:
            return logits
        return mask(logits, k, p)

    setattr(apply_top_k_top_p, _MARK, True)
    return apply_top_k_top_p


def install() -> bool:
    """Replace the expansion when it is broken and guard the mask when an empty step makes it raise;
    returns whether it replaced either. Raises when a replacement does not take effect (vLLM no
    longer calls the function through its module)."""
    module = _module()
    replaced = False
    if not getattr(getattr(module, FUNCTION, None), _MARK, False) and is_broken():
        setattr(expand_batch_to_tokens, _MARK, True)
        setattr(module, FUNCTION, expand_batch_to_tokens)
        replaced = True
    if not getattr(getattr(module, MASK, None), _MARK, False) and empty_step_fails():
        setattr(module, MASK, skipping_empty_steps(getattr(module, MASK)))
        replaced = True
    left = remaining()
    if left:
        raise IncompatibleVllmError(f"the draft-sampling fix did not take effect: {'; '.join(left)}")
    return replaced


def remaining() -> list[str]:
    """What the module in use still gets wrong, both probes together (vLLM's functions or the
    replacements): the expansion's dropped values, and a mask that raises on a step without drafts."""
    return problems() + (["the top-k/top-p mask raises on a step without drafts"] if empty_step_fails() else [])


def is_installed() -> bool:
    return not remaining()
