"""The codec reads the same top-k from vLLM's flat log-probability layout as from per-step dicts."""

from __future__ import annotations

from cascade.codec.distribution import build_distribution
from cascade.codec.engine_codec import step_topk
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.logprob_layouts import Flat, Lp


@given(st.data(), st.integers(1, 16), st.integers(1, 6))
def test_flat_and_dict_layouts_give_the_same_distribution(data: st.DataObject, k: int, steps: int) -> None:
    flat, dicts, chosen = Flat(), [], []
    for _ in range(steps):
        top_ids = data.draw(st.lists(st.integers(0, 63), min_size=k, max_size=k, unique=True))
        top = sorted(zip(top_ids, data.draw(st.lists(st.floats(-20, 0), min_size=k, max_size=k)), strict=True),
                     key=lambda c: -c[1])
        token = data.draw(st.sampled_from(top_ids) | st.integers(0, 63))
        token_lp = dict(top).get(token, data.draw(st.floats(-40, -20)))
        flat.append([(token, token_lp, None), *((t, v, None) for t, v in top)])
        dicts.append({token: Lp(token_lp), **{t: Lp(v) for t, v in top}})
        chosen.append(token)
    for step, token in enumerate(chosen):
        ids_f, values_f, lp_f = step_topk(flat, step, k, token)
        ids_d, values_d, lp_d = step_topk(dicts, step, k, token)
        assert lp_f == lp_d and len(ids_f) == len(ids_d) == k
        a, b = build_distribution(ids_f, values_f, 64, 32), build_distribution(ids_d, values_d, 64, 32)
        assert a.token_ids.tolist() == b.token_ids.tolist() and a.cdf.tolist() == b.cdf.tolist()
