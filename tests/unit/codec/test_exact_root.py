"""RMSNorm's square root, as the exact model takes it, is the correctly rounded one and depends on
the value alone: one value at a time or thousands, the root a row gets must not depend on the batch
it is computed in. Torch's CPU root (MKL's, which earlier releases computed with) is within an ulp."""

from __future__ import annotations

import math

import torch
from cascade.codec.exact import root
from cascade.codec.exact.ops import exact_root
from hypothesis import given, settings
from hypothesis import strategies as st

VALUES = torch.exp(torch.empty(100_000, dtype=torch.float64).uniform_(-20.0, 20.0,
                                                                      generator=torch.Generator().manual_seed(3)))
ROOTS = exact_root(VALUES)


def test_the_root_on_the_cpu_is_the_correctly_rounded_one() -> None:
    assert ROOTS.tolist() == [math.sqrt(v) for v in VALUES.tolist()]
    assert ROOTS.device.type == "cpu"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, VALUES.numel() - 1), min_size=1, max_size=300), st.integers(1, 4))
def test_a_rows_root_does_not_depend_on_the_batch_it_is_computed_in(picks: list[int], stride: int) -> None:
    """Any subset, in any order, contiguous or strided, gets each value's root from the full batch."""
    index = torch.tensor(picks)
    assert torch.equal(exact_root(VALUES[index]), ROOTS[index])
    spread = torch.zeros(len(picks) * stride, dtype=torch.float64)
    spread[::stride] = VALUES[index]
    assert torch.equal(exact_root(spread[::stride]), ROOTS[index])
    assert all(exact_root(VALUES[i:i + 1]).item() == ROOTS[i].item() for i in picks[:20])


def test_the_machine_root_is_within_an_ulp_of_the_correctly_rounded_one() -> None:
    """Why it matters: torch's CPU root is not always ``math.sqrt`` (MKL's vector root differs in ~1 %
    of inputs on some CPUs), but never by more than one ulp, so a container that an earlier release
    wrote with it differs at most at a rare position (and is read again with it: ``root.machine``)."""
    machine = root.machine_root(VALUES[:20_000])
    for value, got in zip(VALUES[:20_000].tolist(), machine.tolist(), strict=True):
        assert abs(got - math.sqrt(value)) <= math.ulp(math.sqrt(value))
    with root.machine():
        assert torch.equal(exact_root(VALUES[:20_000]), machine)
