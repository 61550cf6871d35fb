"""A prediction never changes what the model samples from, and usage counts only the answer.

Speculative decoding with a static-text proposer may change which sample a seed gives, never the
distribution: a drafted token is accepted with the target's own probability of it, a rejection is
resampled from the rest. Before the draft-sampling fix, vLLM's CPU rejection sampler scaled every
drafted position by uninitialised memory instead of the request's temperature, so at any temperature
above 0 every draft was rejected and the answer came from noise.
"""

from __future__ import annotations

import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import openai

from tests.integration.conftest import MODEL, Service

PROMPT = "import os\n\ndef "
SAMPLES = 160


def _complete(client: openai.OpenAI, **kwargs: object) -> openai.types.Completion:
    return client.completions.create(model=MODEL, prompt=PROMPT, **kwargs)  # type: ignore[arg-type]


def _greedy_text(client: openai.OpenAI, max_tokens: int = 40) -> str:
    return _complete(client, max_tokens=max_tokens, temperature=0).choices[0].text


def chi_square_critical(df: int, z: float = 3.09) -> float:
    """Wilson–Hilferty approximation of the chi-square quantile (z = 3.09: p = 0.001)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def two_sample_chi_square(a: Counter[str], b: Counter[str], min_expected: float = 5.0) -> tuple[float, int]:
    """Statistic and degrees of freedom of the homogeneity test of two samples of categories;
    categories too rare for the test are pooled into one."""
    na, nb = sum(a.values()), sum(b.values())
    common = {c for c in a.keys() | b.keys() if (a[c] + b[c]) * min(na, nb) / (na + nb) >= min_expected}
    rows = [(a[c], b[c]) for c in sorted(common)]
    rows.append((na - sum(r[0] for r in rows), nb - sum(r[1] for r in rows)))
    rows = [r for r in rows if sum(r)]
    statistic = 0.0
    for count_a, count_b in rows:
        total = count_a + count_b
        for observed, n in ((count_a, na), (count_b, nb)):
            expected = total * n / (na + nb)
            statistic += (observed - expected) ** 2 / expected
    return statistic, len(rows) - 1


def test_prediction_keeps_the_sampling_distribution_at_the_sdk_default_temperature(openai_client) -> None:
    prediction = {"type": "content", "content": _greedy_text(openai_client)}

    def sample(seed: int, predicted: bool) -> tuple[str, int]:
        extra = {"prediction": prediction} if predicted else {}
        out = _complete(openai_client, max_tokens=4, temperature=1.0, seed=seed, extra_body=extra)
        return out.choices[0].text, out.usage.completion_tokens_details.accepted_prediction_tokens

    with ThreadPoolExecutor(8) as pool:
        plain = list(pool.map(lambda s: sample(s, False), range(SAMPLES)))
        predicted = list(pool.map(lambda s: sample(s, True), range(SAMPLES)))
    statistic, df = two_sample_chi_square(Counter(t for t, _ in plain), Counter(t for t, _ in predicted))
    assert df >= 3, "the test needs a spread of answers to compare"
    assert statistic < chi_square_critical(df), (statistic, df, Counter(t for t, _ in predicted).most_common(5))
    assert sum(accepted for _, accepted in predicted) > SAMPLES // 2, "drafts must be accepted at temperature 1"


def test_prediction_is_accepted_at_low_temperature_and_changes_nothing(openai_client) -> None:
    text = _greedy_text(openai_client, max_tokens=24)
    plain = _complete(openai_client, max_tokens=24, temperature=0.01, seed=0)
    predicted = _complete(openai_client, max_tokens=24, temperature=0.01, seed=0,
                          extra_body={"prediction": {"type": "content", "content": text}})
    assert plain.choices[0].text == predicted.choices[0].text == text
    assert predicted.usage.completion_tokens_details.accepted_prediction_tokens >= 16


def test_usage_counts_only_prediction_tokens_inside_an_answer_cut_by_a_stop_sequence(openai_client) -> None:
    text = _greedy_text(openai_client, max_tokens=64)
    prediction = {"type": "content", "content": text}
    for stop in (["return"], ["\n\n"], ["Convert"]):
        for stream in (False, True):
            kwargs = dict(max_tokens=64, temperature=0, stop=stop, extra_body={"prediction": prediction})
            if stream:
                chunks = list(_complete(openai_client, stream=True, stream_options={"include_usage": True},
                                        **kwargs))
                answer = "".join(c.choices[0].text for c in chunks if c.choices)
                usage = chunks[-1].usage
            else:
                out = _complete(openai_client, **kwargs)
                answer, usage = out.choices[0].text, out.usage
            assert usage is not None
            details = usage.completion_tokens_details
            assert text.startswith(answer) and len(answer) < len(text), (stop, answer)
            assert 0 < details.accepted_prediction_tokens < usage.completion_tokens, (stop, stream, usage)


def test_usage_counts_only_prediction_tokens_before_a_stop_token_id(service: Service, openai_client) -> None:
    """A stop token id ends the answer inside the engine, in the middle of an accepted draft: usage
    still counts only what the answer holds."""
    text = _greedy_text(openai_client, max_tokens=64)
    with service.client() as client:
        ids = client.post("/v1/tokenize", json={"model": MODEL, "prompt": text}).json()["tokens"]
    stop_id = next(t for j, t in enumerate(ids) if j >= 8 and t not in ids[:j])
    out = _complete(openai_client, max_tokens=64, temperature=0,
                    extra_body={"prediction": {"type": "content", "content": text}, "stop_token_ids": [stop_id]})
    answer, usage = out.choices[0].text, out.usage
    assert out.choices[0].finish_reason == "stop" and text.startswith(answer) and len(answer) < len(text), answer
    assert usage is not None
    assert 0 < usage.completion_tokens_details.accepted_prediction_tokens < usage.completion_tokens, usage


def test_a_seeded_sample_with_a_prediction_repeats_whatever_was_answered_before(openai_client) -> None:
    """Earlier answers of the same scope are a draft source, and drafts decide which sample a seed
    gives: a seeded request draws only on its own prediction, prompt and output, so it repeats."""
    prediction = {"type": "content", "content": "import sys\nimport warnings\n\nfrom . import _core\n"}
    texts = [openai_client.completions.create(model=MODEL, prompt="import os\n", max_tokens=20, temperature=0.8,
                                              seed=11, extra_body={"prediction": prediction}).choices[0].text
             for _ in range(4)]
    assert len(set(texts)) == 1, texts


def test_a_sampled_prediction_that_drafts_nothing_survives_every_sampling_constraint(openai_client) -> None:
    """vLLM's CPU rejection sampler runs on every step of the predict engine, drafts or not; its
    top-k-only mask took the maximum of an empty tensor on a step without drafts and killed the
    engine. Each constraint is tried with a prediction that never matches, then the engine must
    still answer."""
    useless = {"type": "content", "content": "zzzz qqqq xxxx " * 4}
    constraints: list[dict[str, object]] = [
        {"top_k": 5}, {"top_p": 0.9}, {"top_k": 5, "top_p": 0.9}, {"presence_penalty": 1.0},
        {"frequency_penalty": 1.0}, {"top_k": 3, "repetition_penalty": 1.2}]
    for constraint in constraints:
        sampled = {k: v for k, v in constraint.items() if k in ("top_p", "presence_penalty", "frequency_penalty")}
        extra = {k: v for k, v in constraint.items() if k not in sampled} | {"prediction": useless}
        out = _complete(openai_client, max_tokens=6, temperature=1.0, seed=3, extra_body=extra, **sampled)
        assert out.choices[0].finish_reason == "length", constraint
        assert out.usage.completion_tokens == 6
    assert _greedy_text(openai_client, max_tokens=8), "the engine must still answer"
