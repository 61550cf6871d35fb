"""k-CBS against vLLM's own beam search, concurrency scaling, and the bound vs Monte Carlo.

    python benchmarks/bench_kcbs.py          # starts its own engines (CPU, default model)

Same prompts, same k (beam width) and T (steps), measured in one run. vLLM's beam search runs
through ``LLM.beam_search`` (offline API); k-CBS through Cascade's driver on an ``AsyncLLM``.
"""

from __future__ import annotations

import asyncio
import math
import time

PROMPTS = ["import os\n\ndef ", "class Parser:\n    def ", "for i in range(", "def test_"]


async def kcbs_run(engines, prompt_ids, k, steps, rid):  # type: ignore[no-untyped-def]
    from cascade.kcbs import KcbsSearch
    from cascade.kcbs.driver import run_search

    search = KcbsSearch(k, steps, True, 1, "block")
    async for _ in run_search(engines.top_logprobs, prompt_ids, search, k, 1, 1.0, rid, set()):
        pass
    return search.result()


async def main() -> None:
    from cascade.engine.manager import EngineManager
    from cascade.kcbs import match_target
    from cascade.settings import Settings
    from vllm import LLM, SamplingParams
    from vllm.sampling_params import BeamSearchParams

    settings = Settings(enable_predictions=False, enable_codec=False, memory_fraction=0.15)
    engines = EngineManager(settings)
    await engines.start()
    tok = engines.tokenizer
    prompt_ids = [tok.encode(p, add_special_tokens=False) for p in PROMPTS]
    llm = LLM(model=settings.model, dtype="float32", max_model_len=1024, kv_cache_memory_bytes=512 << 20,
              enforce_eager=True, seed=0)
    rows = []
    for k in (2, 4, 8):
        for steps in (16, 64):
            params = BeamSearchParams(beam_width=k, max_tokens=steps, ignore_eos=True)
            llm.beam_search([{"prompt_token_ids": prompt_ids[0]}], params)
            start = time.perf_counter()
            llm.beam_search([{"prompt_token_ids": ids} for ids in prompt_ids], params)
            vllm_s = time.perf_counter() - start
            start = time.perf_counter()
            await asyncio.gather(*(kcbs_run(engines, ids, k, steps, f"b{k}-{steps}-{i}")
                                   for i, ids in enumerate(prompt_ids)))
            kcbs_s = time.perf_counter() - start
            rows.append((k, steps, vllm_s, kcbs_s))
    print("| k | T | vLLM beam search (s, 4 prompts) | k-CBS (s, 4 prompts) | speed-up |")
    print("|---|---|---|---|---|")
    for k, steps, v, c in rows:
        print(f"| {k} | {steps} | {v:.2f} | {c:.2f} | {v / c:.2f} |")

    print()
    print("| concurrent k-CBS requests (k=4, T=32) | wall (s) | requests/s |")
    print("|---|---|---|")
    for n in (1, 8):
        start = time.perf_counter()
        await asyncio.gather(*(kcbs_run(engines, prompt_ids[i % 4], 4, 32, f"c{n}-{i}") for i in range(n)))
        wall = time.perf_counter() - start
        print(f"| {n} | {wall:.2f} | {n / wall:.2f} |")

    print()
    print("| k | T | target | k-CBS bound | Monte Carlo estimate (N samples) | samples for ±bound/2 at 95% |")
    print("|---|---|---|---|---|---|")
    for k in (4, 8):
        steps = 12
        greedy = llm.generate([{"prompt_token_ids": prompt_ids[0]}],
                              SamplingParams(max_tokens=steps, temperature=0, ignore_eos=True))[0].outputs[0]
        target = list(greedy.token_ids)
        result = await kcbs_run(engines, prompt_ids[0], k, steps, f"mc{k}")
        bound = match_target(result, target, 0).near_verbatim_probability
        n = 2000
        samples = llm.generate([{"prompt_token_ids": prompt_ids[0]}],
                               SamplingParams(n=n, max_tokens=steps, temperature=1.0, top_k=k, seed=1,
                                              ignore_eos=True))[0].outputs
        hits = sum(1 for s in samples if list(s.token_ids) == target)
        p = hits / n
        needed = math.ceil(4 * 1.96**2 * (1 - bound) / bound) if bound > 0 else float("inf")
        print(f"| {k} | {steps} | greedy continuation | {bound:.4f} | {p:.4f} ({n}) | {needed} |")
    engines.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
