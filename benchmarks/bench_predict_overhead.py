"""What a prediction engine costs a request that gets no help from its prediction.

    python benchmarks/bench_predict_overhead.py [--rounds 10]

Times one 200-token greedy request, interleaved round by round, on: the main engine (what a request
without prediction uses), the main engine with vLLM's async scheduling off, and the predict engine
(K = 64) without a prediction and with a useless one. vLLM turns async scheduling off for
``custom_class`` proposers, so the last two isolate the proposer's own cost from the engine's.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from bench_predict import PROMPTS, run, start_engine


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()

    from cascade.engine.config import EngineRole, engine_kwargs
    from cascade.settings import Settings
    from cascade.vllm_compat.request_keys import prediction_extra_args

    settings = Settings()
    engines = {"main": start_engine(engine_kwargs(settings, EngineRole.MAIN)),
               "main, async scheduling off": start_engine({**engine_kwargs(settings, EngineRole.MAIN),
                                                           "async_scheduling": False}),
               "predict": start_engine(engine_kwargs(settings.model_copy(update={"num_speculative_tokens": 64}),
                                                     EngineRole.PREDICT))}
    tokenizer = engines["main"].get_tokenizer()
    prompt = tokenizer.encode(PROMPTS[1], add_special_tokens=False)
    useless = prediction_extra_args(tokenizer.encode("SELECT * FROM t;\n" * 10, add_special_tokens=False), "smart")
    runs = {"main": ("main", None), "main, async scheduling off": ("main, async scheduling off", None),
            "predict, no prediction": ("predict", None), "predict, useless prediction": ("predict", useless)}
    for name, engine in engines.items():
        await run(engine, prompt, None, f"warm {name}", 200)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(args.rounds):
        for name, (engine, extra) in runs.items():
            times[name].append((await run(engines[engine], prompt, extra, f"{name} {r}", 200))[1])
    print("| request | best s | median s | × main (best) | × main (median) |")
    print("|---|---|---|---|---|")
    base = times["main"]
    for name, values in times.items():
        print(f"| {name} | {min(values):.3f} | {statistics.median(values):.3f} | {min(base) / min(values):.2f} | "
              f"{statistics.median(base) / statistics.median(values):.2f} |")
    for engine in engines.values():
        engine.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
