"""The exact codec on a CUDA GPU against the CPU, with no vLLM and no HTTP (a lent GPU machine has torch
but not vLLM): containers crossing CPU↔GPU, and throughput each way on both devices of one machine.

    python benchmarks/gpu/codec_cuda.py --device cuda|cpu --text FILE --out DIR [--sizes 4096,32768]
        [--peer DIR (containers another machine wrote: must decode here, and match this run's bytes)]

For each size: compress the first SIZE bytes of ``--text`` with the service's defaults (top-k 1024,
32-bit coder, container version 4, the latency lane plan), decompress the container, check the round
trip, and write it to ``DIR/SIZE.cz``. With ``--peer``, each ``PEER/SIZE.cz`` is decompressed here and
compared with this run's container byte for byte: the exact model computes the same integers on every
device, so a GPU writes the CPU's bytes. The pipeline's own self-test (the shipped reference containers
of both versions, written and read) runs first. Prints one row per size; ratios go in RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "service")]

from cascade.codec.exact.device import load_codec_model  # noqa: E402
from cascade.codec.exact.known_answer import reference_path  # noqa: E402
from cascade.codec.exact.model import NUMERICS_VERSION  # noqa: E402
from cascade.codec.exact.runner import ExactRunner, RunnerStats  # noqa: E402
from cascade.codec.pipeline import CodecPipeline, CompressOptions, CompressStats  # noqa: E402
from cascade.engine.fingerprint import model_fingerprint  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

MODEL = REPO / "models" / "pycoder-23m"
# The service's defaults are restated here (options, runner, pipeline): ``cascade.settings`` needs
# pydantic-settings, which a lent GPU machine lacks. codec_top_k, codec_precision_bits, codec_lane_tokens,
# codec_lanes, codec_lane_steps:
OPTIONS = CompressOptions(top_k=1024, precision_bits=32, lane_tokens=1000, lanes=16, step_budget=768)


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def compress(pipe: CodecPipeline, data: bytes) -> tuple[bytes, int]:
    stats = CompressStats()
    container = b"".join([part async for part in pipe.compress(_one(data), OPTIONS, stats, "bench")])
    return container, stats.tokens


async def decompress(pipe: CodecPipeline, container: bytes) -> bytes:
    return b"".join([part async for _, part in pipe.decompress(_one(container), "bench")])


def timed(coro_fn, *args):  # type: ignore[no-untyped-def]
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    result = asyncio.run(coro_fn(*args))
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--text", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sizes", default="4096,32768")
    parser.add_argument("--peer", type=Path)
    parser.add_argument("--model", type=Path, default=MODEL, help="model folder (default: models/pycoder-23m)")
    parser.add_argument("--decode-max", type=int, default=1 << 30, help="larger sizes are only compressed")
    parser.add_argument("--no-graphs", action="store_true",
                        help="launch decode passes op by op (codec_cuda_graphs off)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    fingerprint = model_fingerprint(str(args.model))
    start = time.perf_counter()
    model, moved, _ = load_codec_model(args.device, args.model, 1024, "fast", reference_path(fingerprint))
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"device {model.device} ({name}), torch {torch.__version__}, kernels {model.kernel_summary()}, "
          f"known answer passed, loaded in {time.perf_counter() - start:.1f}s{'; ' + moved if moved else ''}"
          f"{'; CUDA graphs off' if args.no_graphs and args.device == 'cuda' else ''}",
          flush=True)
    runner = ExactRunner(model, model.config.vocab_size, max_rows=32, prefill_tokens=1024, max_draft=16,
                         cuda_graphs=not args.no_graphs)
    pipe = CodecPipeline(max_positions=1024, window=8)  # max_model_len, codec_segments_in_flight
    pipe.attach(runner, NUMERICS_VERSION, AutoTokenizer.from_pretrained(str(args.model)), fingerprint)
    _, seconds = timed(pipe.self_test)
    print(f"self-test (reference containers v3 and v4 written and read): passed in {seconds:.1f}s", flush=True)
    text = args.text.read_bytes()
    print("| bytes | tokens | compress s | tok/s | decompress s | tok/s | round trip | peer decodes | peer equal |")
    print("|---|---|---|---|---|---|---|---|---|")
    failed = False
    notes: list[str] = []
    for size in map(int, args.sizes.split(",")):
        data = text[:size]
        (container, tokens), c_s = timed(compress, pipe, data)
        before = dataclasses.replace(runner.stats)
        back, d_s = timed(decompress, pipe, container) if size <= args.decode_max else (data, float("nan"))
        notes.append(decode_note(size, before, runner))
        (args.out / f"{size}.cz").write_bytes(container)
        peer_decodes = peer_equal = "-"
        if args.peer is not None and (args.peer / f"{size}.cz").exists():
            theirs = (args.peer / f"{size}.cz").read_bytes()
            peer_decodes = "yes" if asyncio.run(decompress(pipe, theirs)) == data else "NO"
            peer_equal = "yes" if theirs == container else "NO"
        ok = back == data
        failed |= not ok or "NO" in (peer_decodes, peer_equal)
        trip = ("exact" if ok else "WRONG") if size <= args.decode_max else "-"
        print(f"| {size} | {tokens} | {c_s:.2f} | {tokens / c_s:.0f} | {d_s:.2f} | {tokens / d_s:.0f} | "
              f"{trip} | {peer_decodes} | {peer_equal} |", flush=True)
    print("\n".join(notes), flush=True)
    pipe.close()
    sys.exit(1 if failed else 0)


def decode_note(size: int, before: RunnerStats, runner: ExactRunner) -> str:
    """Where a decompression's steps went: their count, tokens per lane and step, the runner's own split
    of its time, and the CUDA graphs captured (counted over the process: the cohort keeps its graphs)."""
    s = runner.stats
    steps, rows = s.decode_steps - before.decode_steps, s.row_steps - before.row_steps
    graphs = runner._cohort.graphs
    captured = (f"; graphs so far: {graphs.captures} captured in {graphs.capture_seconds:.2f} s, "
                f"{graphs.replays} replays" if graphs is not None else "")
    return (f"{size} B decode: {steps} steps, {(s.decoded_tokens - before.decoded_tokens) / max(1, rows):.2f} "
            f"tokens per lane-step, model {s.model_seconds - before.model_seconds:.2f} s, pick "
            f"{s.pick_seconds - before.pick_seconds:.2f} s{captured}")


if __name__ == "__main__":
    main()
