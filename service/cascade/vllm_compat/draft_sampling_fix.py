"""Make vLLM's rejection sampler see each request's own temperature, top-k and top-p on the CPU.

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
"""

from __future__ import annotations

from typing import Any

from cascade.vllm_compat.version import IncompatibleVllmError

MODULE = "vllm.v1.sample.rejection_sampler"
FUNCTION = "expand_batch_to_tokens"
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


def install() -> bool:
    """Replace the expansion when it is broken; returns whether it replaced it. Raises when the
    replacement does not take effect (vLLM no longer calls the function through its module)."""
    module = _module()
    if getattr(getattr(module, FUNCTION, None), _MARK, False) or not is_broken():
        return False
    setattr(expand_batch_to_tokens, _MARK, True)
    setattr(module, FUNCTION, expand_batch_to_tokens)
    left = problems()
    if left:
        raise IncompatibleVllmError(f"the draft-sampling fix did not take effect: {'; '.join(left)}")
    return True


def is_installed() -> bool:
    """The expansion in use is correct (vLLM's own, or the replacement)."""
    return not is_broken()
