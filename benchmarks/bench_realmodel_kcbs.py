"""k-CBS against vLLM's beam search on a real model.

    python benchmarks/bench_realmodel_kcbs.py [--model smollm2-135m-instruct] [--ks 2,4,8] [--steps 16,32]

Same code prompts, same k (beam width) and T (steps), one run: vLLM's ``LLM.beam_search`` (offline
API, ``BeamSearchParams``, EOS ignored) and Cascade's k-CBS driver on an ``AsyncLLM`` built by Cascade's
engine manager (EOS blocked until T, as in the method). Columns: wall time for all prompts, the ratio,
the probability k-CBS captures (its deterministic lower bound on the k returned sequences under top-k
sampling), and on how many prompts both searches rank the same sequence first.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


PROMPTS = ["def fibonacci(n):\n", "class Stack:\n    def ", "import json\n\n\ndef load_config(path):\n",
           "for i in range("]


async def kcbs_run(engines: Any, prompt_ids: list[int], k: int, steps: int, eos_id: int | None, rid: str) -> Any:
    """One k-CBS search as the route runs it (EOS blocked until T, the model's own EOS id)."""
    from cascade.kcbs import KcbsSearch
    from cascade.kcbs.driver import run_search

    search = KcbsSearch(k, steps, True, eos_id, "block")
    async for _ in run_search(engines.top_logprobs, prompt_ids, search, k, eos_id, 1.0, rid, set()):
        pass
    return search.result()


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--ks", default="2,4,8")
    parser.add_argument("--steps", default="16,32")
    args = parser.parse_args()

    from cascade.engine.manager import EngineManager
    from cascade.model_registry import resolve_model
    from cascade.settings import Settings
    from vllm import LLM
    from vllm.sampling_params import BeamSearchParams

    settings = Settings(model=resolve_model(args.model), enable_predictions=False, enable_codec=False)
    engines = EngineManager(settings)
    await engines.start()
    tok = engines.tokenizer
    prompt_ids = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    llm = LLM(model=settings.model, dtype="float32", max_model_len=settings.max_model_len,
              kv_cache_memory_bytes=512 << 20, enforce_eager=True, seed=0)
    rows = []
    for k in (int(x) for x in args.ks.split(",")):
        for steps in (int(x) for x in args.steps.split(",")):
            params = BeamSearchParams(beam_width=k, max_tokens=steps, ignore_eos=True)
            llm.beam_search([{"prompt_token_ids": prompt_ids[0]}], params)
            start = time.perf_counter()
            beams = llm.beam_search([{"prompt_token_ids": ids} for ids in prompt_ids], params)
            vllm_s = time.perf_counter() - start
            start = time.perf_counter()
            results = await asyncio.gather(*(kcbs_run(engines, ids, k, steps, tok.eos_token_id, f"b{k}-{steps}-{i}")
                                             for i, ids in enumerate(prompt_ids)))
            kcbs_s = time.perf_counter() - start
            captured = [r.captured_probability for r in results]
            same_best = sum(list(b.sequences[0].tokens)[-steps:] == list(r.sequences[0].token_ids)
                            for b, r in zip(beams, results, strict=True))
            rows.append((k, steps, vllm_s, kcbs_s, min(captured), max(captured), same_best))
    engines.shutdown()
    print(f"model {settings.model}, {len(PROMPTS)} prompts per row")
    print()
    print("| k | T | vLLM beam search (s) | k-CBS (s) | × vLLM (speed) | k-CBS captured probability (min–max) "
          "| same best sequence |")
    print("|---|---|---|---|---|---|---|")
    for k, steps, v, c, lo, hi, same in rows:
        print(f"| {k} | {steps} | {v:.2f} | {c:.2f} | {v / c:.2f} | {lo:.3g}–{hi:.3g} | {same}/{len(PROMPTS)} |")


if __name__ == "__main__":
    asyncio.run(main())
