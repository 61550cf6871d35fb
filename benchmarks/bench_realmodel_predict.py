"""Predicted outputs on a real instruct model: Cascade's static-text proposer against no prediction and
against vLLM's n-gram prompt-lookup proposer, on 24 code-edit chat tasks.

    python benchmarks/bench_realmodel_predict.py [--model smollm2-135m-instruct] [--tasks 24] [--ngram-k 8]

Each task (benchmarks/realmodel_tasks.py) is a chat request asking for an edit of a small file
(rename, add a parameter, add a docstring, fix a bug, delete a function, reorder, reformat, …), rendered
with the model's chat template as the chat route renders it, greedy, up to ``--max-tokens``. Three
engines built with Cascade's own engine arguments, one after another in this process: the main engine
(no speculative decoding: the baseline), the prediction engine (Cascade's static-text proposer, adaptive
draft length up to K=64, the prediction is the original file) and a plain vLLM engine with
``speculative_config={"method": "ngram", ...}`` (prompt lookup: it drafts from the prompt, which holds
the original file, with no prediction sent). The main engine stays up; each task runs on it right
before it runs on the engine measured, so every ratio compares runs seconds apart (the machine may be
shared). Columns: × = tokens/s against that baseline run; acc = accepted draft tokens / output
tokens; same = output text identical to the baseline's (and to the first baseline run).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "service"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from realmodel_tasks import tasks


@dataclass
class Run:
    text: str
    seconds: float
    tokens: int
    accepted: int


@dataclass
class Task:
    name: str
    prompt_ids: list[int]
    prediction_ids: list[int]
    runs: dict[str, Run] = field(default_factory=dict)
    base: dict[str, Run] = field(default_factory=dict)


async def start_engine(kwargs: dict[str, Any], hooks: tuple[str, ...] = ()) -> Any:
    """An engine as the service builds it: Cascade's worker extension, and the role's hooks installed."""
    from cascade.vllm_compat.worker_extension import WORKER_EXTENSION, install_engine_hooks
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs, worker_extension_cls=WORKER_EXTENSION))
    if hooks:
        await install_engine_hooks(engine, list(hooks))
    return engine


async def generate(engine: Any, prompt_ids: list[int], rid: str, max_tokens: int,
                   extra: dict[str, Any] | None = None) -> Run:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, extra_args=extra)
    start = time.perf_counter()
    final = None
    async for out in engine.generate({"prompt_token_ids": prompt_ids}, params, rid):
        final = out
    seconds = time.perf_counter() - start
    assert final is not None
    completion = final.outputs[0]
    metrics = completion.spec_decode_metrics
    accepted = sum(j * c for j, c in enumerate(metrics.histogram)) if metrics is not None else 0
    return Run(completion.text, seconds, len(completion.token_ids), accepted)


async def measure(base: Any, engine: Any, label: str, items: list[Task], max_tokens: int, repeat: int,
                  with_prediction: bool) -> None:
    """Each task runs on the baseline engine right before ``engine`` (the machine is shared: a ratio
    compares runs seconds apart)."""
    from cascade.vllm_compat.request_keys import prediction_extra_args

    await generate(engine, items[0].prompt_ids, f"{label}-warm", max_tokens)
    for task in items:
        extra = prediction_extra_args(task.prediction_ids, "smart") if with_prediction else None
        plain = [await generate(base, task.prompt_ids, f"{label}-base-{task.name}-{r}", max_tokens)
                 for r in range(repeat)]
        runs = [await generate(engine, task.prompt_ids, f"{label}-{task.name}-{r}", max_tokens, extra)
                for r in range(repeat)]
        task.base[label] = min(plain, key=lambda run: run.seconds)
        task.runs[label] = min(runs, key=lambda run: run.seconds)
        print(f"  {label} {task.name}: {task.runs[label].tokens} tokens in {task.runs[label].seconds:.2f}s "
              f"(baseline {task.base[label].seconds:.2f}s)", file=sys.stderr, flush=True)


def print_tables(items: list[Task], labels: list[str]) -> None:
    first = labels[0]
    print("| task | tokens | no prediction tok/s | " + " | ".join(f"{lb} × | {lb} acc | {lb} same" for lb in labels)
          + " |")
    print("|---|---|---|" + "---|---|---|" * len(labels))
    for task in items:
        b = task.base[first]
        cells = []
        for lb in labels:
            r, base = task.runs[lb], task.base[lb]
            cells.append(f"{base.seconds / r.seconds:.2f} | {r.accepted / max(r.tokens, 1):.0%} | "
                         f"{r.text == base.text == b.text}")
        print(f"| {task.name} | {b.tokens} | {b.tokens / b.seconds:.1f} | " + " | ".join(cells) + " |")
    print()
    print("| engine | output tokens | tok/s (all tasks) | baseline tok/s (same tasks, interleaved) | × baseline "
          "(all tasks) | × per task median (min–max) | accepted share | text identical |")
    print("|---|---|---|---|---|---|---|---|")
    for lb in labels:
        tokens = sum(t.runs[lb].tokens for t in items)
        seconds = sum(t.runs[lb].seconds for t in items)
        base_tokens = sum(t.base[lb].tokens for t in items)
        base_seconds = sum(t.base[lb].seconds for t in items)
        ratios = [t.base[lb].seconds / t.runs[lb].seconds for t in items]
        accepted = sum(t.runs[lb].accepted for t in items) / max(tokens, 1)
        same = sum(t.runs[lb].text == t.base[lb].text for t in items)
        print(f"| {lb} | {tokens} | {tokens / seconds:.1f} | {base_tokens / base_seconds:.1f} | "
              f"{base_seconds / seconds:.2f} | {statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | "
              f"{accepted:.0%} | {same}/{len(items)} |")


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="registry name, folder or hub id")
    parser.add_argument("--tasks", type=int, default=24)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=1, help="runs per request; the fastest counts")
    parser.add_argument("--ngram-k", type=int, default=8, help="num_speculative_tokens of the n-gram engine")
    parser.add_argument("--ngram-max", type=int, default=4, help="prompt_lookup_max of the n-gram engine")
    parser.add_argument("--ngram-min", type=int, default=2, help="prompt_lookup_min of the n-gram engine")
    args = parser.parse_args()

    from cascade.engine.config import ROLE_HOOKS, EngineRole, engine_kwargs
    from cascade.model_registry import resolve_model
    from cascade.predict.static_text import normalise_newlines
    from cascade.settings import Settings

    settings = Settings(model=resolve_model(args.model))
    main_engine = await start_engine(engine_kwargs(settings, EngineRole.MAIN), ROLE_HOOKS[EngineRole.MAIN])
    tokenizer = main_engine.get_tokenizer()
    items = []
    for name, message, prediction in tasks()[:args.tasks]:
        text = tokenizer.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                             tokenize=False)
        items.append(Task(name, list(tokenizer.encode(text, add_special_tokens=False)),
                          list(tokenizer.encode(normalise_newlines(prediction), add_special_tokens=False))))
    labels = [f"cascade K={settings.num_speculative_tokens}", f"vLLM ngram K={args.ngram_k}"]
    predict = await start_engine(engine_kwargs(settings, EngineRole.PREDICT), ROLE_HOOKS[EngineRole.PREDICT])
    await measure(main_engine, predict, labels[0], items, args.max_tokens, args.repeat, True)
    predict.shutdown()
    ngram_kwargs = {**engine_kwargs(settings, EngineRole.MAIN), "per_request_spec_decode_metrics": "summary",
                    "speculative_config": {"method": "ngram", "num_speculative_tokens": args.ngram_k,
                                           "prompt_lookup_max": args.ngram_max,
                                           "prompt_lookup_min": args.ngram_min}}
    ngram = await start_engine(ngram_kwargs)
    await measure(main_engine, ngram, labels[1], items, args.max_tokens, args.repeat, False)
    ngram.shutdown()
    main_engine.shutdown()
    print_tables(items, labels)


if __name__ == "__main__":
    asyncio.run(main())
