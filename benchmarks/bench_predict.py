"""Predicted outputs on real edit cases built from the model's own greedy output.

    python benchmarks/bench_predict.py            # starts its own engines (CPU, default model)

For code prompts, G = greedy output; predictions P are real edits of G (exact, delete a stanza,
rename a variable, insert lines, reorder two functions, truncated, extended) and a useless one.
Each case runs (none) without prediction, (smart) our re-anchoring proposer, (prefix) OpenAI-style
abandon-at-first-miss, and (ngram) vLLM's built-in n-gram proposer with the prediction in nothing
but its own context. Prints tokens/step, accepted/rejected tokens and tokens/s relative to (none).
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

PROMPTS = ["import os\n\ndef ", "class Config:\n    def __init__(self", "def parse_args(argv):\n",
           "import json\n\n\ndef load"]
MAX_TOKENS = 200


def edits(text: str) -> dict[str, str]:
    lines = text.split("\n")
    mid = len(lines) // 2
    names = re.findall(r"\b([a-z_][a-z0-9_]{3,})\b", text)
    rename = max(set(names), key=names.count) if names else None
    cases = {"exact": text, "delete_stanza": "\n".join(lines[:mid] + lines[mid + 3:]),
             "insert_lines": "\n".join([*lines[:mid], "    # TODO: check this", "    pass", *lines[mid:]]),
             "longer": text + "\n\ndef extra():\n    return None\n", "shorter": "\n".join(lines[: max(1, mid)]),
             "useless": "SELECT * FROM t;\n" * 10}
    if rename:
        cases["rename_var"] = re.sub(rf"\b{rename}\b", rename + "_x", text)
    blocks = re.split(r"(?m)^(?=def |class )", text)
    if len(blocks) >= 3:
        blocks[1], blocks[2] = blocks[2], blocks[1]
        cases["reorder_funcs"] = "".join(blocks)
    return cases


async def run(engine: Any, prompt_ids: list[int], extra: dict[str, Any] | None,
              rid: str) -> tuple[str, float, Any, int]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0, extra_args=extra)
    start = time.perf_counter()
    final = None
    async for out in engine.generate({"prompt_token_ids": prompt_ids}, params, rid):
        final = out
    elapsed = time.perf_counter() - start
    completion = final.outputs[0]
    return completion.text, elapsed, completion.spec_decode_metrics, len(completion.token_ids)


def accepted_of(metrics: Any) -> tuple[int, int, int]:
    if metrics is None:
        return 0, 0, 0
    accepted = sum(j * c for j, c in enumerate(metrics.histogram))
    return accepted, metrics.num_draft_tokens - accepted, sum(metrics.histogram)


async def main() -> None:
    from cascade.engine.config import EngineRole, engine_kwargs
    from cascade.predict.static_text import normalise_newlines
    from cascade.predict.vllm_proposer import prediction_extra_args
    from cascade.settings import Settings
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    settings = Settings(memory_fraction=0.2)
    main_engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(settings, EngineRole.MAIN)))
    predict_engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs(settings, EngineRole.PREDICT)))
    ngram_kwargs = {**engine_kwargs(settings, EngineRole.PREDICT), "speculative_config": {
        "method": "ngram", "num_speculative_tokens": settings.num_speculative_tokens,
        "prompt_lookup_max": 4, "prompt_lookup_min": 2}}
    ngram_engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**ngram_kwargs))
    tok = main_engine.get_tokenizer()
    rows = []
    for p_index, prompt in enumerate(PROMPTS):
        ids = tok.encode(prompt, add_special_tokens=False)
        await run(main_engine, ids, None, f"warm{p_index}")
        greedy, base_time, _, n_tokens = await run(main_engine, ids, None, f"g{p_index}")
        for case, prediction in edits(greedy).items():
            pred_ids = tok.encode(normalise_newlines(prediction), add_special_tokens=False)
            row = {"case": f"{p_index}:{case}", "tokens": n_tokens, "none_s": base_time}
            for mode in ("smart", "prefix"):
                text, secs, metrics, _ = await run(predict_engine, ids, prediction_extra_args(pred_ids, mode),
                                                   f"{mode}{p_index}{case}")
                acc, rej, steps = accepted_of(metrics)
                row[mode] = (secs, acc, rej, steps, text == greedy)
            text, secs, metrics, _ = await run(ngram_engine, ids, None, f"ng{p_index}{case}")
            acc, rej, steps = accepted_of(metrics)
            row["ngram"] = (secs, acc, rej, steps, text == greedy)
            rows.append(row)
    print("| case | tokens | smart acc/rej | smart tok/step | smart × speed | prefix acc/rej | prefix × speed | "
          "ngram acc/rej | ngram × speed | same text |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s, p, g = r["smart"], r["prefix"], r["ngram"]
        tps = r["tokens"] / max(1, s[3]) if s[3] else 1.0
        print(f"| {r['case']} | {r['tokens']} | {s[1]}/{s[2]} | {tps:.2f} | {r['none_s'] / s[0]:.2f} | {p[1]}/{p[2]} | "
              f"{r['none_s'] / p[0]:.2f} | {g[1]}/{g[2]} | {r['none_s'] / g[0]:.2f} | {s[4] and p[4] and g[4]} |")
    for engine in (main_engine, predict_engine, ngram_engine):
        engine.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
