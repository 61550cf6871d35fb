"""Decompression latency of small inputs: speculative exact decoding and the lane plan, as ratios.

    python benchmarks/bench_codec_latency.py [--model-dir DIR] [--sizes 1024,4096] [--kinds code,prose]
        [--lane-tokens 1000,512,256,128] [--max-draft 16] [--threads N]

In process (no HTTP, no tokenizer time): held-out code and prose (``bench_codec``'s), tokenized with
the model's tokenizer, coded as ONE segment (what a small input is) with lanes of each
``--lane-tokens`` under ``[</s>]``, then decoded by a runner without speculation (``max_draft=0``,
today's decoder: one token per lane per step) and by one with it, in the same run. Per row: the
payload's bits per byte (the segment's payload only: framing is the same ~90 bytes for every
plan), decode seconds and steps without and with drafts, the speed-up, and mean tokens a lane
advanced per step. Every round trip must be exact (asserted).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "service"), str(REPO / "benchmarks")]

from bench_codec import MODEL_DIR, held_out_code, held_out_prose  # noqa: E402
from cascade.codec.exact.model import ExactLlama  # noqa: E402
from cascade.codec.exact.runner import ExactRunner, single_threaded  # noqa: E402
from cascade.codec.lanes import lane_lengths, split_lanes  # noqa: E402


async def decode_once(runner: ExactRunner, prompt: list[int], lengths: list[int], payload: bytes, top_k: int
                      ) -> tuple[list[list[int]], float, int, float]:
    steps = runner.stats.decode_steps
    decoded, rows = runner.stats.decoded_tokens, runner.stats.row_steps
    start = time.perf_counter()
    back = await runner.decode(prompt, lengths, payload, top_k, 32)
    seconds = time.perf_counter() - start
    per_step = (runner.stats.decoded_tokens - decoded) / max(1, runner.stats.row_steps - rows)
    return back, seconds, runner.stats.decode_steps - steps, per_step


MODES = {  # name: ExactRunner keyword arguments (max_draft from --max-draft where not 0)
    "plain": {"max_draft": 0},
    "ngram": {"look_ahead": False},
    "ahead": {"look_ahead": True},
    "ahead-pad": {"look_ahead": True, "pad_drafts": True},
}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", default=str(MODEL_DIR))
    parser.add_argument("--sizes", default="1024,4096")
    parser.add_argument("--kinds", default="code,prose")
    parser.add_argument("--lane-tokens", default="1000,512,256,128")
    parser.add_argument("--max-draft", default="16", help="comma-separated: each speculative mode at each length")
    parser.add_argument("--modes", default="plain,ngram,ahead",
                        help=f"decoders compared, first is the baseline: {', '.join(MODES)}")
    parser.add_argument("--rounds", type=int, default=1, help="decodes per decoder per input (interleaved; medians)")
    parser.add_argument("--top-k", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--bits-only", action="store_true", help="code only: the bits/byte table (no decoding)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = single_threaded(ExactLlama.from_pretrained, args.model_dir, args.max_model_len)
    vocab = model.config.vocab_size
    runners: dict[str, ExactRunner] = {}
    for mode in args.modes.split(","):
        for draft in ([0] if mode == "plain" else [int(x) for x in args.max_draft.split(",")]):
            name = mode if mode == "plain" else f"{mode}/{draft}"
            runners[name] = ExactRunner(model, vocab, threads=args.threads or None,
                                        **{"max_draft": draft, **MODES[mode]})  # type: ignore[arg-type]
    base = next(iter(runners))
    prompt = [int(tokenizer.eos_token_id or 0)]
    print(f"model {Path(args.model_dir).name}, top-k {args.top_k}, in process, {args.rounds} interleaved round(s), "
          f"baseline {base}")
    print("| text | bytes | tokens | lane tokens | lanes | bits/byte | decoder | seconds | steps | × baseline s "
          "| tokens/step/lane |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    try:
        for kind in args.kinds.split(","):
            source = held_out_code if kind == "code" else held_out_prose
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
                        print(f"{head} | | | | |", flush=True)
                        continue
                    seconds: dict[str, list[float]] = {name: [] for name in runners}
                    counts: dict[str, tuple[int, float]] = {}
                    for _ in range(max(1, args.rounds)):
                        for name, runner in runners.items():
                            back, s, steps, per_step = await decode_once(runner, prompt, lengths, coded.payload,
                                                                         args.top_k)
                            assert back == lanes, f"{name}: round trip differs"
                            seconds[name].append(s)
                            counts[name] = (steps, per_step)
                    base_s = statistics.median(seconds[base])
                    for name in runners:
                        s = statistics.median(seconds[name])
                        steps, per_step = counts[name]
                        print(f"{head} {name} | {s:.2f} | {steps} | {base_s / s:.2f}× | {per_step:.2f} |", flush=True)
    finally:
        for runner in runners.values():
            await asyncio.to_thread(runner.close)


if __name__ == "__main__":
    asyncio.run(main())
