"""Predicted outputs per draft length K and for the adaptive proposer, on real edit cases.

    python benchmarks/bench_predict.py                     # K = 8,16,32,64 fixed; adaptive at K = 32, 64
    python benchmarks/bench_predict.py --ks 8,64 --adaptive-ks 64 --repeat 5 --prompts 2

For code prompts, G = the model's greedy output; predictions P are edits of G (exact, delete a stanza,
rename a variable, insert lines, reorder two functions, shorter, longer, useless) and ``resplit``: G's
own text, sent as token ids whose boundaries differ from the model's every 7th token (the draft
tokenises differently from the output). Each configuration is a predict engine with K draft tokens;
"fixed" always drafts K, "adaptive" lets each request choose (``cascade.predict.draft_length``).
Without prediction the request runs on a plain engine, as the service does.

Columns: × = tokens/s against no prediction (both best of ``--repeat`` runs; no prediction is timed
again for each configuration and prompt, right before its cases); acc/rej = the engine's
accepted/rejected draft tokens; "after edit" = the share of the output after the first edited line,
in lines the prediction still holds, that came from accepted drafts ("–" under 20 such tokens;
exact, longer and resplit: the share of the whole output), from an exact replay of the engine's
greedy acceptance rule whose accepted counts are checked against the engine's. Output text is
compared with no prediction in every run.
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

PROMPTS = ["import os\n\ndef ", "class Config:\n    def __init__(self", "def parse_args(argv):\n",
           "import json\n\n\ndef load"]
MIN_AFTER_EDIT = 20  # tokens: an edit near the end of the output leaves too few to make a share


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


def resplit(output_ids: list[int], vocab: Any, every: int = 7) -> list[int]:
    """The output's own text with other token boundaries: every ``every``-th token of two bytes or
    more becomes two tokens (both halves exist: the byte-level vocabulary has every byte)."""
    ids: list[int] = []
    for i, token in enumerate(output_ids):
        piece = vocab.piece(token)
        if i % every == every - 1 and len(piece) >= 2:
            ids += vocab.encode(piece[:1]) + vocab.encode(piece[1:])
        else:
            ids.append(token)
    return ids


def follows_after_edit(greedy: str, prediction: str) -> tuple[int, int] | None:
    """Byte range of G from the end of its first edited line on, restricted to lines that P still
    holds after that point, as (start, kept bytes) — None when P equals G or holds nothing of it."""
    g_lines, p_lines = greedy.splitlines(keepends=True), prediction.splitlines(keepends=True)
    opcodes = difflib.SequenceMatcher(None, g_lines, p_lines, autojunk=False).get_opcodes()
    first = next((op for op in opcodes if op[0] != "equal"), None)
    if first is None:
        return None
    edit_end = first[2] + (1 if first[1] == first[2] else 0)
    return edit_end, sum(i2 - max(i1, edit_end) for tag, i1, i2, _, _ in opcodes
                         if tag == "equal" and i2 > edit_end)


def recovered_after_edit(greedy: str, prediction: str, output_ids: list[int], accepted_at: list[bool],
                         vocab: Any) -> float | None:
    """Share of G's tokens after the edit, in lines P holds, that were accepted drafts."""
    span = follows_after_edit(greedy, prediction)
    if span is None or span[1] == 0:
        return None
    edit_end, _ = span
    g_lines = greedy.splitlines(keepends=True)
    p_lines = prediction.splitlines(keepends=True)
    kept: set[int] = set()
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, g_lines, p_lines, autojunk=False).get_opcodes():
        if tag == "equal":
            kept.update(i for i in range(i1, i2) if i >= edit_end)
    line_of_byte: list[int] = []
    for index, line in enumerate(g_lines):
        line_of_byte += [index] * len(line.encode())
    position, total, accepted = 0, 0, 0
    for token, was_accepted in zip(output_ids, accepted_at, strict=True):
        if position < len(line_of_byte) and line_of_byte[position] in kept:
            total += 1
            accepted += was_accepted
        position += len(vocab.piece(token))
    return accepted / total if total >= MIN_AFTER_EDIT else None


@dataclass
class Outcome:
    seconds: float
    accepted: int
    rejected: int
    same_text: bool
    recovered: float | None = None
    replay_matches: bool = True
    none_seconds: float = 0.0


@dataclass
class Case:
    name: str
    prompt_ids: list[int]
    greedy: str
    output_ids: list[int]
    prediction_ids: list[int]
    prediction_text: str
    same_split: bool
    outcomes: dict[str, Outcome] = field(default_factory=dict)


async def run(engine: Any, prompt_ids: list[int], extra: dict[str, Any] | None, rid: str,
              max_tokens: int) -> tuple[str, float, Any, list[int]]:
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, extra_args=extra)
    start = time.perf_counter()
    final = None
    async for out in engine.generate({"prompt_token_ids": prompt_ids}, params, rid):
        final = out
    elapsed = time.perf_counter() - start
    assert final is not None
    completion = final.outputs[0]
    return completion.text, elapsed, completion.spec_decode_metrics, list(completion.token_ids)


def accepted_of(metrics: Any) -> tuple[int, int]:
    if metrics is None:
        return 0, 0
    accepted = sum(j * c for j, c in enumerate(metrics.histogram))
    return accepted, metrics.num_draft_tokens - accepted


def replay(case: Case, vocab: Any, k: int, adaptive: bool) -> tuple[list[bool], int]:
    """Which output tokens came from accepted drafts, by the engine's greedy rule (pure core)."""
    from cascade.predict.draft_length import ConfidenceLength, FixedLength
    from cascade.predict.simulator import simulate

    lengths = ConfidenceLength(k) if adaptive else FixedLength(k)
    result = simulate(case.output_ids, case.prediction_ids, vocab, k, prompt=case.prompt_ids, lengths=lengths)
    # The engine's first step is the prefill, which drafts nothing: the replay starts the same way.
    accepted_at: list[bool] = []
    for accepted in result.accepted_per_step:
        accepted_at += [True] * accepted + [False]
    return accepted_at[:len(case.output_ids)], result.accepted


def start_engine(kwargs: dict[str, Any]) -> Any:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))


async def build_cases(engine: Any, vocab: Any, tokenizer: Any, prompts: list[str], max_tokens: int) -> list[Case]:
    from cascade.predict.static_text import normalise_newlines

    cases = []
    for p_index, prompt in enumerate(prompts):
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        greedy, _, _, output_ids = await run(engine, ids, None, f"g{p_index}", max_tokens)
        same_split = list(tokenizer.encode(greedy, add_special_tokens=False)) == output_ids
        for name, prediction in edits(greedy).items():
            text = normalise_newlines(prediction)
            pred_ids = list(tokenizer.encode(text, add_special_tokens=False))
            cases.append(Case(f"{p_index}:{name}", ids, greedy, output_ids, pred_ids, text,
                              same_split))
        split_ids = resplit(output_ids, vocab)
        cases.append(Case(f"{p_index}:resplit", ids, greedy, output_ids, split_ids, greedy, False))
    return cases


async def measure(engine: Any, main_engine: Any, cases: list[Case], config: str, k: int, adaptive: bool,
                  vocab: Any, repeat: int, max_tokens: int) -> None:
    """Each prompt's no-prediction time is measured again right before its cases (the machine is
    shared: a ratio should compare runs taken minutes, not half an hour, apart)."""
    from cascade.vllm_compat.request_keys import prediction_extra_args

    for p_index in sorted({c.name.split(":")[0] for c in cases}):
        first = next(c for c in cases if c.name.startswith(f"{p_index}:"))
        await run(engine, first.prompt_ids, None, f"{config}warm{p_index}", max_tokens)
    none_seconds: dict[str, float] = {}
    for case in cases:
        prompt_key = case.name.split(":")[0]
        if prompt_key not in none_seconds:
            none_seconds[prompt_key] = min([(await run(main_engine, case.prompt_ids, None,
                                                       f"{config}none{prompt_key}.{r}", max_tokens))[1]
                                            for r in range(repeat)])
        extra = prediction_extra_args(case.prediction_ids, "smart", adaptive=adaptive)
        times, same, counts = [], True, (0, 0)
        for r in range(repeat):
            text, secs, metrics, _ = await run(engine, case.prompt_ids, extra, f"{config}{case.name}.{r}",
                                               max_tokens)
            times.append(secs)
            same = same and text == case.greedy
            counts = accepted_of(metrics)
        accepted_at, replay_accepted = replay(case, vocab, k, adaptive)
        recovered = recovered_after_edit(case.greedy, case.prediction_text, case.output_ids, accepted_at, vocab)
        if case.name.endswith((":exact", ":resplit", ":longer")):
            recovered = sum(accepted_at) / len(accepted_at) if accepted_at else None
        case.outcomes[config] = Outcome(min(times), counts[0], counts[1], same, recovered,
                                        replay_accepted == counts[0], none_seconds[prompt_key])


def speed(case: Case, config: str) -> float:
    outcome = case.outcomes[config]
    return outcome.none_seconds / outcome.seconds


def print_tables(cases: list[Case], configs: list[str]) -> None:
    print("| case | tokens | G tokenises as output | "
          + " | ".join(f"{c} × (acc/rej)" for c in configs) + " | " + " | ".join(f"{c} after edit" for c in configs)
          + " | same text |")
    print("|---|---|---|" + "---|" * (2 * len(configs) + 1))
    for case in cases:
        cells = [f"{speed(case, c):.2f} ({case.outcomes[c].accepted}/{case.outcomes[c].rejected})" for c in configs]
        rec = [f"{case.outcomes[c].recovered:.0%}" if case.outcomes[c].recovered is not None else "–"
               for c in configs]
        same = all(case.outcomes[c].same_text for c in configs)
        print(f"| {case.name} | {len(case.output_ids)} | {case.same_split} | " + " | ".join(cells) + " | "
              + " | ".join(rec) + f" | {same} |")
    print()
    print("| config | P = G × (min–max) | resplit × (min–max) | single local edit × (median) | "
          "after one local edit accepted (min) | useless × (min) | text identical | replay = engine |")
    print("|---|---|---|---|---|---|---|---|")
    for c in configs:
        def pick(suffixes: tuple[str, ...], cfg: str = c) -> list[Case]:
            return [x for x in cases if x.name.endswith(suffixes) and x.outcomes[cfg] is not None]
        exact = [speed(x, c) for x in pick((":exact",))]
        split = [speed(x, c) for x in pick((":resplit",))]
        local = pick((":delete_stanza", ":insert_lines"))
        useless = [speed(x, c) for x in pick((":useless",))]
        recovered = [r for x in local if (r := x.outcomes[c].recovered) is not None]
        print(f"| {c} | {min(exact):.2f}–{max(exact):.2f} | {min(split):.2f}–{max(split):.2f} | "
              f"{statistics.median(speed(x, c) for x in local):.2f} | "
              f"{min(recovered):.0%} | {min(useless):.2f} | "
              f"{all(x.outcomes[c].same_text for x in cases)} | {all(x.outcomes[c].replay_matches for x in cases)} |")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ks", default="8,16,32,64", help="K of the fixed-length configurations")
    parser.add_argument("--adaptive-ks", default="32,64", help="K (largest draft) of the adaptive configurations")
    parser.add_argument("--repeat", type=int, default=3, help="runs per request; the fastest counts")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args()

    from cascade.engine.config import EngineRole, engine_kwargs
    from cascade.settings import Settings
    from cascade.vllm_compat.proposer import tokenizer_vocabulary

    settings = Settings()
    main_engine = start_engine(engine_kwargs(settings, EngineRole.MAIN))
    tokenizer = main_engine.get_tokenizer()
    vocab = tokenizer_vocabulary(tokenizer)
    cases = await build_cases(main_engine, vocab, tokenizer, PROMPTS[:args.prompts], args.max_tokens)
    fixed = [int(k) for k in args.ks.split(",") if k]
    adaptive = {int(k) for k in args.adaptive_ks.split(",") if k}
    configs: list[str] = []
    for k in sorted(set(fixed) | adaptive):
        engine = start_engine(engine_kwargs(settings.model_copy(update={"num_speculative_tokens": k}),
                                            EngineRole.PREDICT))
        for is_adaptive in (False, True):
            if (k in adaptive) if is_adaptive else (k in fixed):
                config = f"{'adaptive' if is_adaptive else 'fixed'} K={k}"
                await measure(engine, main_engine, cases, config, k, is_adaptive, vocab, args.repeat,
                              args.max_tokens)
                configs.append(config)
        engine.shutdown()
    main_engine.shutdown()
    print_tables(cases, configs)


if __name__ == "__main__":
    asyncio.run(main())
