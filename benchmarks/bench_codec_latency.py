"""Decompression latency of small inputs: speculative exact decoding and the lane plan, as ratios.

    python benchmarks/bench_codec_latency.py [--model-dir DIR] [--sizes 1024,4096] [--kinds code,prose,records]
        [--lane-tokens 1000,512,256,128] [--modes plain,ngram] [--max-draft 16] [--rounds 1] [--threads N]
        [--bits-only | --ceiling]

In process (no HTTP, no tokenizer time): held-out code and prose (``bench_codec``'s) and seeded JSON
records (``records``: structured text that repeats), tokenized with
the model's tokenizer, coded as ONE segment (what a small input is) with lanes of each
``--lane-tokens`` under ``[</s>]``, then decoded by a runner without speculation (``max_draft=0``,
today's decoder: one token per lane per step) and by one with it, in the same run. Per row: the
payload's bits per byte (the segment's payload only: framing is the same ~90 bytes for every
plan), decode seconds and steps without and with drafts, the speed-up, and mean tokens a lane
advanced per step, drafted tokens per step, and "× by pass cost": tokens per step ÷ (1 +
``--position-cost`` × drafted tokens per step), the speed-up the counts give at the pass cost
``bench_exact_pass_cost.py`` measured (load-free, unlike the seconds). Every round trip must be exact
(asserted). ``--modes``/``--max-draft``: the decoders
compared, each input decoded by each in turn (``--rounds`` times, medians), so their seconds share
the machine's load.

``--replay N``: no model — each draft source replayed on ``N`` consecutive held-out pieces of each
kind and size (the default plan's lanes; a draft is accepted while it equals the text, which is what
the exact decoder gives, and a step decodes the lanes in turn as the runner does), priced with the
one-row pass costs ``bench_exact_pass_cost.py`` measures (``--row-cost``, ``--first-cost``,
``--further-cost``: a step's extra rows, a row's first drafted position and each further one, in
one-row steps): the speed-up over plain decoding across many texts, where the timed rows see one.

``--ceiling``: what any drafter that guesses tokens without running the model can reach at best —
the share of tokens that are the model's own top-1 choice, and the tokens per step of an *oracle*
that drafts the exact model's greedy chain for free (accepted while the text follows it; the
first miss still decodes its token, as a verify pass does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "service"), str(REPO / "benchmarks")]

from bench_codec import MODEL_DIR, held_out_code, held_out_prose  # noqa: E402
from cascade.codec.exact.drafts import SegmentDrafts, ngram_source  # noqa: E402
from cascade.codec.exact.model import ExactLlama  # noqa: E402
from cascade.codec.exact.runner import ExactRunner, single_threaded  # noqa: E402
from cascade.codec.lanes import lane_lengths, split_lanes  # noqa: E402
from cascade.predict.token_source import TokenNgramSource  # noqa: E402


def records(limit: int) -> bytes:
    """JSON lines of generated records (seeded): the repeating, structured text drafts are for."""
    rng = random.Random(7)
    names = ["ada", "grace", "alan", "edsger", "barbara", "donald", "frances", "ken", "dennis", "margaret"]
    out = bytearray()
    i = 0
    while len(out) < limit:
        name = rng.choice(names)
        out += json.dumps({"id": i, "user": f"{name}{rng.randrange(100)}", "email": f"{name}@example.org",
                           "active": rng.random() < 0.7, "score": round(rng.uniform(0, 100), 2),
                           "tags": rng.sample(["a", "b", "c", "d", "e"], rng.randrange(1, 4))}).encode() + b"\n"
        i += 1
    return bytes(out[:limit])


KINDS = {"code": held_out_code, "prose": held_out_prose, "records": records}


async def decode_once(runner: ExactRunner, prompt: list[int], lengths: list[int], payload: bytes, top_k: int
                      ) -> tuple[list[list[int]], float, int, float, float]:
    steps = runner.stats.decode_steps
    decoded, rows, drafted = runner.stats.decoded_tokens, runner.stats.row_steps, runner.stats.drafted_tokens
    start = time.perf_counter()
    back = await runner.decode(prompt, lengths, payload, top_k, 32)
    seconds = time.perf_counter() - start
    row_steps = max(1, runner.stats.row_steps - rows)
    per_step = (runner.stats.decoded_tokens - decoded) / row_steps
    drafted_per_step = (runner.stats.drafted_tokens - drafted) / row_steps
    return back, seconds, runner.stats.decode_steps - steps, per_step, drafted_per_step


MODES: dict[str, dict[str, Any]] = {  # name: ExactRunner keyword arguments (max_draft from --max-draft where not 0)
    "plain": {"max_draft": 0},
    "ngram": {},
    "ngram1": {"draft_source": lambda: TokenNgramSource(min_n=1, max_n=16)},
}


def ceiling(model: ExactLlama, tokenizer: Any, args: argparse.Namespace) -> None:
    """Top-1 share and the greedy oracle's tokens per step (drafts of 4 and 16), first lane of each input."""
    print(f"model {Path(args.model_dir).name}: the exact model's top-1 against the text, first lane")
    print("| text | bytes | tokens | top-1 share | oracle tokens/step, drafts of 4 | of 16 |")
    print("|---|---|---|---|---|---|")
    prompt = [int(tokenizer.eos_token_id or 0)]
    for kind in args.kinds.split(","):
        source = KINDS[kind]
        for size in (int(x) for x in args.sizes.split(",")):
            ids = list(tokenizer.encode(source(size).decode("utf-8", "ignore"), add_special_tokens=False))
            lane = ids[:int(args.lane_tokens.split(",")[0])]
            hidden = single_threaded(model.prefill, [prompt + lane[:-1]])
            right: list[bool] = []
            for a in range(0, hidden.shape[0], 64):
                top = single_threaded(model.logits, hidden[a:a + 64]).argmax(dim=1).tolist()
                right += [t == x for t, x in zip(top, lane[a:a + 64], strict=True)]
            rates = []
            for window in (4, 16):
                steps = at = 0
                while at < len(right):
                    run = 0
                    while run < window and at + run < len(right) and right[at + run]:
                        run += 1
                    at += run + 1
                    steps += 1
                rates.append(len(right) / steps)
            share = sum(right) / len(right)
            print(f"| {kind} | {size} | {len(lane)} | {share:.2f} | {rates[0]:.2f} | {rates[1]:.2f} |", flush=True)


def pass_cost(drafts: list[int], args: argparse.Namespace) -> float:
    """One verify pass of ``len(drafts)`` rows with these draft lengths, in one-row steps."""
    return (1 + args.row_cost * (len(drafts) - 1)
            + sum(args.first_cost + args.further_cost * (d - 1) for d in drafts if d))


def replay_cost(lanes: list[list[int]], source: Any, max_draft: int, args: argparse.Namespace) -> float:
    """The passes a segment's decode takes with ``source``'s drafts (none with ``max_draft`` 0), priced.
    As the runner: the segment's lanes draft together (``SegmentDrafts.propose``, at most 32 positions a
    pass), and a step decodes the lanes' streams in turn, from the lane where the last one stopped, up to
    the first lane whose next distribution the pass did not compute."""
    drafts = SegmentDrafts(source, [0], len(lanes), max(1, max_draft))
    done = [0] * len(lanes)
    next_lane, total = 0, 0.0
    while running := [i for i, lane in enumerate(lanes) if done[i] < len(lane)]:
        left = [len(lanes[i]) - done[i] for i in running]
        guesses = (drafts.propose(running, [lanes[i][:done[i]] for i in running], left, 32 - len(running),
                                  len(running)) if max_draft else [[] for _ in running])
        total += pass_cost([len(g) for g in guesses], args)
        draft = dict(zip(running, guesses, strict=True))
        decoded: dict[int, list[int]] = {i: [] for i in running}
        walking, at = list(running), running.index(next_lane)
        while walking:
            i = walking[at]
            used = len(decoded[i])
            if used > len(draft[i]) or (used and decoded[i][-1] != draft[i][used - 1]):
                break
            decoded[i].append(lanes[i][done[i] + used])
            if done[i] + used + 1 < len(lanes[i]):
                at += 1
            else:
                walking.pop(at)
            if walking:
                at %= len(walking)
        next_lane = walking[at] if walking else 0
        for i in running:
            drafts.record(i, decoded[i])
            done[i] += len(decoded[i])
    return total


def replay(tokenizer: Any, args: argparse.Namespace) -> None:
    """``--replay``: every mode's speed-up over plain decoding by pass cost, on many held-out pieces."""
    modes = [m for m in args.modes.split(",") if m != "plain"]
    lane_tokens = int(args.lane_tokens.split(",")[0])
    max_draft = int(args.max_draft.split(",")[0])
    print(f"no model: {args.replay} consecutive held-out pieces per row, lanes of {lane_tokens} tokens, drafts ≤ "
          f"{max_draft}; pass cost 1 + {args.row_cost}·(rows − 1) + {args.first_cost} per drafting row + "
          f"{args.further_cost} per further drafted position")
    print("| text | bytes | pieces | " + " | ".join(f"{m} × plain" for m in modes) + " |")
    print("|---|---|---|" + "---|" * len(modes))
    for kind in args.kinds.split(","):
        source = KINDS[kind]
        for size in (int(x) for x in args.sizes.split(",")):
            text = source(size * args.replay)
            pieces = [text[i:i + size] for i in range(0, len(text) - size + 1, size)]
            plain = 0.0
            costs = dict.fromkeys(modes, 0.0)
            for piece in pieces:
                ids = list(tokenizer.encode(piece.decode("utf-8", "ignore"), add_special_tokens=False))
                lanes = split_lanes(ids, lane_tokens)
                plain += replay_cost(lanes, ngram_source(), 0, args)
                for mode in modes:
                    costs[mode] += replay_cost(lanes, MODES[mode].get("draft_source", ngram_source)(), max_draft, args)
            ratios = " | ".join(f"{plain / costs[m]:.3f}×" for m in modes)
            print(f"| {kind} | {size} | {len(pieces)} | {ratios} |", flush=True)


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", default=str(MODEL_DIR))
    parser.add_argument("--sizes", default="1024,4096")
    parser.add_argument("--kinds", default="code,prose")
    parser.add_argument("--lane-tokens", default="1000,512,256,128")
    parser.add_argument("--max-draft", default="16", help="comma-separated: each speculative mode at each length")
    parser.add_argument("--modes", default="plain,ngram",
                        help=f"decoders compared, first is the baseline: {', '.join(MODES)}")
    parser.add_argument("--rounds", type=int, default=1, help="decodes per decoder per input (interleaved; medians)")
    parser.add_argument("--top-k", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--bits-only", action="store_true", help="code only: the bits/byte table (no decoding)")
    parser.add_argument("--position-cost", type=float, default=0.13,
                        help="cost of one drafted position in steps (bench_exact_pass_cost.py: SmolLM2 ~0.13)")
    parser.add_argument("--replay", type=int, default=0, help="no model: replay drafts on this many pieces")
    parser.add_argument("--row-cost", type=float, default=0.29)
    parser.add_argument("--first-cost", type=float, default=0.28)
    parser.add_argument("--further-cost", type=float, default=0.17)
    parser.add_argument("--ceiling", action="store_true", help="top-1 share and greedy-oracle tokens/step only")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    if args.replay:
        replay(tokenizer, args)
        return
    model = single_threaded(ExactLlama.from_pretrained, args.model_dir, args.max_model_len)
    vocab = model.config.vocab_size
    if args.ceiling:
        ceiling(model, tokenizer, args)
        return
    runners: dict[str, ExactRunner] = {}
    for mode in args.modes.split(","):
        for draft in ([0] if mode == "plain" else [int(x) for x in args.max_draft.split(",")]):
            name = mode if mode == "plain" else f"{mode}/{draft}"
            runners[name] = ExactRunner(model, vocab, threads=args.threads or None,
                                        **{"max_draft": draft, **MODES[mode]})
    base = next(iter(runners))
    prompt = [int(tokenizer.eos_token_id or 0)]
    print(f"model {Path(args.model_dir).name}, top-k {args.top_k}, in process, {args.rounds} interleaved round(s), "
          f"baseline {base}")
    print("| text | bytes | tokens | lane tokens | lanes | bits/byte | decoder | seconds | steps | × baseline s "
          "| tokens/step/lane | drafted/step/lane | × by pass cost |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    try:
        for kind in args.kinds.split(","):
            source = KINDS[kind]
            for size in (int(x) for x in args.sizes.split(",")):
                data = source(size)
                ids = list(tokenizer.encode(data.decode("utf-8", "ignore"), add_special_tokens=False))
                for lane_tokens in (int(x) for x in args.lane_tokens.split(",")):
                    lanes = split_lanes(ids, lane_tokens)
                    coded = await runners[base].encode(prompt, lanes, args.top_k, 32)
                    lengths = lane_lengths(len(ids), lane_tokens)
                    head = (f"| {kind} | {len(data)} | {len(ids)} | {lane_tokens} | {len(lanes)} "
                            f"| {8 * len(coded.payload) / len(data):.3f} |")
                    if args.bits_only:
                        print(f"{head} | | | | | | | |", flush=True)
                        continue
                    seconds: dict[str, list[float]] = {name: [] for name in runners}
                    counts: dict[str, tuple[int, float, float]] = {}
                    for _ in range(max(1, args.rounds)):
                        for name, runner in runners.items():
                            back, s, steps, per_step, drafted = await decode_once(
                                runner, prompt, lengths, coded.payload, args.top_k)
                            assert back == lanes, f"{name}: round trip differs"
                            seconds[name].append(s)
                            counts[name] = (steps, per_step, drafted)
                    base_s = statistics.median(seconds[base])
                    for name in runners:
                        s = statistics.median(seconds[name])
                        steps, per_step, drafted = counts[name]
                        cost = 1 + args.position_cost * drafted
                        print(f"{head} {name} | {s:.2f} | {steps} | {base_s / s:.2f}× | {per_step:.2f} | {drafted:.2f} "
                              f"| {per_step / cost:.2f}× |", flush=True)
    finally:
        for runner in runners.values():
            await asyncio.to_thread(runner.close)


if __name__ == "__main__":
    asyncio.run(main())
