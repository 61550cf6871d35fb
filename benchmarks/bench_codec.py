"""Exact-codec benchmark against a running service, both directions through HTTP, figures as ratios.

    python benchmarks/bench_codec.py --url http://127.0.0.1:8000 [--bytes 1048576] [--kinds code,prose]
        [--model-dir DIR (the served model's folder; default models/pycoder-23m)]

Held-out text: code the default model never trained on (its model card: the stdlib packages json/,
email/, http/, asyncio/ of CPython 3.11) and prose it never saw (rendered man pages of sections 7, 5
and 2 of this machine). For each: the container's bits/byte against the *float* model's
cross-entropy over the same lanes (transformers, float32, each lane conditioned on ``</s>`` only, as
the codec's lanes are), the exact model's own cross-entropy (from the service's statistics),
``xz -9e`` and ``zstd -19 --long`` measured in the same run; the container's framing; compress
throughput against vLLM's float prefill of the same lanes, and decompress throughput against vLLM's
float greedy decoding at the same parallelism (as many concurrent sequences as the decoder runs
lanes at once). The round trip must be exact.

Two figures come from the exact model in this process (the service does not expose its runner's
counters): the coder's share of a decode step (frequency tables and range decoder against the
model's forward pass and logits, ``RunnerStats.pick_share``) decoding ``--parallel`` lanes of the
same text, ``--share-tokens`` each, and the exact model's resident weights and tables.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gzip
import json
import lzma
import math
import shutil
import subprocess
import sysconfig
import time
from pathlib import Path

import httpx

HELD_OUT = ("json", "email", "http", "asyncio")
MODEL_DIR = Path(__file__).resolve().parents[1] / "models" / "pycoder-23m"
LATENCY_BYTES = 4096
RENDER = "GROFF_NO_SGR=1 groff -t -man -Tutf8 -rLL=100n -rHY=0 -dAD=l 2>/dev/null | col -bx | sed 's/^       //'"


def held_out_code(limit: int) -> bytes:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = bytearray()
    for package in HELD_OUT:
        for path in sorted((root / package).rglob("*.py")):
            out += path.read_bytes()
            if len(out) >= limit:
                return bytes(out[:limit])
    return bytes(out)


def held_out_prose(limit: int) -> bytes:
    out = bytearray()
    for section in (7, 5, 2):
        for page in sorted(Path(f"/usr/share/man/man{section}").glob("*.gz")):
            if page.is_symlink() or page.name.endswith("ssl.gz"):
                continue
            source = gzip.decompress(page.read_bytes())
            if any(line.startswith(b".so ") for line in source[:200].splitlines()):
                continue
            text = subprocess.run(["sh", "-c", RENDER], input=source, capture_output=True).stdout
            if not text.strip() or len(text) > 60000:
                continue
            out += text.rstrip(b"\n") + b"\n"
            if len(out) >= limit:
                return bytes(out[:limit]).decode("utf-8", "ignore").encode()
    return bytes(out)


def zstd_size(data: bytes) -> int | None:
    exe = shutil.which("zstd")
    if exe is None:
        return None
    return len(subprocess.run([exe, "-19", "--long", "-c", "-q"], input=data, capture_output=True,
                              check=True).stdout)


def float_cross_entropy_bits(lanes: list[list[int]], separator: int, model_dir: Path) -> float:
    """The float32 model's code length for every lane, each conditioned on ``</s>`` only."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    bits = 0.0
    with torch.no_grad():
        for lane in lanes:
            ids = torch.tensor([[separator, *lane]])
            logp = model(ids).logits[0, :-1].double().log_softmax(-1)
            bits -= float(logp.gather(1, ids[0, 1:, None]).sum()) / math.log(2)
    return bits


def container_payload_bytes(container: bytes) -> int:
    _service_path()
    from cascade.codec.container import parse_container

    return sum(len(s.payload) for s in parse_container(container).segments)


async def round_trip_seconds(client: httpx.AsyncClient, data: bytes) -> float:
    """Wall time of one compress then one decompress of ``data`` (raw bodies), checked exact."""
    start = time.perf_counter()
    r = await client.post("/compress", content=data, headers={"content-type": "text/plain"})
    r.raise_for_status()
    back = await client.post("/decompress", content=r.content, headers={"content-type": "application/octet-stream"})
    back.raise_for_status()
    assert back.content == data, "the 4 KB round trip differs"
    return time.perf_counter() - start


async def vllm_prefill_seconds(client: httpx.AsyncClient, model: str, lanes: list[list[int]], separator: int,
                               concurrency: int) -> float:
    """vLLM's float prefill of the same lanes (one-token completions of token-id prompts)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(lane: list[int]) -> None:
        async with gate:
            r = await client.post("/v1/completions", json={"model": model, "prompt": [separator, *lane],
                                                             "max_tokens": 1, "temperature": 0})
            r.raise_for_status()

    start = time.perf_counter()
    await asyncio.gather(*(one(lane) for lane in lanes))
    return time.perf_counter() - start


async def vllm_greedy_tokens_per_second(client: httpx.AsyncClient, model: str, parallel: int, tokens: int,
                                        separator: int) -> float:
    """vLLM's float greedy decoding with ``parallel`` sequences in flight, ``tokens`` each."""
    async def one(i: int) -> int:
        r = await client.post("/v1/completions", json={"model": model, "prompt": [separator, 100 + i],
                                                         "max_tokens": tokens, "temperature": 0,
                                                         "ignore_eos": True})
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(i) for i in range(parallel)))
    return sum(counts) / (time.perf_counter() - start)


def _service_path() -> None:
    import sys

    service = str(Path(__file__).resolve().parents[1] / "service")
    if service not in sys.path:
        sys.path.insert(0, service)


async def coder_share(lanes: list[list[int]], args: argparse.Namespace) -> tuple[float, float, float]:
    """Decode ``--parallel`` lanes through an in-process runner: (coder share of a step, decode
    tokens/s, exact-model MiB)."""
    _service_path()
    from cascade.codec.exact.model import ExactLlama
    from cascade.codec.exact.runner import ExactRunner, single_threaded

    model = single_threaded(ExactLlama.from_pretrained, args.model_dir, args.max_model_len)
    runner = ExactRunner(model, model.config.vocab_size, max_rows=args.parallel,
                         threads=args.codec_threads or None)
    picked = [lane[:args.share_tokens] for lane in lanes[:args.parallel]]
    try:
        coded = await runner.encode([1], picked, args.top_k, 32)
        before = (runner.stats.model_seconds, runner.stats.pick_seconds)
        start = time.perf_counter()
        back = await runner.decode([1], [len(lane) for lane in picked], coded.payload, args.top_k, 32)
        seconds = time.perf_counter() - start
        assert back == picked, "in-process round trip differs"
        model_s = runner.stats.model_seconds - before[0]
        pick_s = runner.stats.pick_seconds - before[1]
    finally:
        await asyncio.to_thread(runner.close)
    return pick_s / (model_s + pick_s), sum(map(len, picked)) / seconds, model.nbytes() / 2**20


async def run_kind(kind: str, data: bytes, args: argparse.Namespace, headers: dict[str, str]) -> list[str]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.model_dir))
    separator = int(tokenizer.eos_token_id)
    params = {"lane_tokens": args.lane_tokens, "lanes": args.lanes}
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=7200) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        start = time.perf_counter()
        r = await client.post("/compress", content=data, params=params,
                              headers={"content-type": "text/plain", "accept": "text/event-stream"})
        compress_s = time.perf_counter() - start
        r.raise_for_status()
        events = [(block.split("\n")[0][7:], json.loads(block.split("data: ", 1)[1]))
                  for block in r.text.strip().split("\n\n") if block.startswith("event: ")]
        container = b"".join(base64.b64decode(e["data"]) for name, e in events if name == "chunk")
        done = next(e for name, e in events if name == "done")
        latency = await round_trip_seconds(client, data[:LATENCY_BYTES])
        start = time.perf_counter()
        back = await client.post("/decompress", content=container,
                                 headers={"content-type": "application/octet-stream"})
        decompress_s = time.perf_counter() - start
        exact = back.status_code == 200 and back.content == data
        ids = tokenizer.encode(data.decode("utf-8", "replace"), add_special_tokens=False)
        lanes = [ids[i:i + args.lane_tokens] for i in range(0, len(ids), args.lane_tokens)]
        prefill_s = await vllm_prefill_seconds(client, model, lanes, separator, args.prefill_concurrency)
        greedy = await vllm_greedy_tokens_per_second(client, model, args.parallel, args.lane_tokens, separator)
    n = len(data)
    tokens = len(ids)
    float_bits = float_cross_entropy_bits(lanes, separator, args.model_dir)
    payload = container_payload_bytes(container)
    xz = len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    z = zstd_size(data)
    share, share_rate, model_mib = await coder_share(lanes, args)
    rows = [
        f"| {kind} | {n} | {tokens} | {8 * len(container) / n:.4f} | {float_bits / n:.4f} | "
        f"{done['ideal_bits_per_token'] * done['tokens'] / n:.4f} | "
        f"{8 * len(container) / float_bits:.4f} | {8 * xz / n:.3f} | "
        f"{'n/a' if z is None else f'{8 * z / n:.3f}'} | {100 * (len(container) - payload) / len(container):.3f} % | "
        f"{tokens / compress_s:.0f} | {(tokens / prefill_s):.0f} | {prefill_s / compress_s:.3f} | "
        f"{tokens / decompress_s:.0f} | {greedy:.0f} | {(tokens / decompress_s) / greedy:.3f} | {exact} | "
        f"{100 * share:.1f} % ({share_rate:.0f} tok/s in-process) | {model_mib:.0f} MiB | {latency:.2f} s |"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key")
    parser.add_argument("--bytes", type=int, default=65536)
    parser.add_argument("--kinds", default="code,prose")
    parser.add_argument("--lane-tokens", type=int, default=1000)
    parser.add_argument("--lanes", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=32, help="the decoder's rows (codec_max_rows)")
    parser.add_argument("--prefill-concurrency", type=int, default=16)
    parser.add_argument("--share-tokens", type=int, default=64, help="tokens per lane of the in-process share run")
    parser.add_argument("--top-k", type=int, default=1024, help="the service's codec_top_k")
    parser.add_argument("--max-model-len", type=int, default=1024, help="the service's max_model_len")
    parser.add_argument("--codec-threads", type=int, default=0, help="the service's codec_threads")
    parser.add_argument("--model-dir", type=Path, default=MODEL_DIR,
                        help="the served model's folder (tokenizer, float cross-entropy, in-process share run)")
    args = parser.parse_args()
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    sources = {"code": held_out_code, "prose": held_out_prose}
    print(f"lane_tokens={args.lane_tokens} lanes/segment={args.lanes} decoder rows={args.parallel} "
          f"bytes={args.bytes}")
    print("| text | bytes | tokens | container bits/byte | float CE bits/byte | exact CE bits/byte | × float CE | "
          "xz -9e | "
          "zstd -19 --long | framing | compress tok/s | vLLM prefill tok/s | × prefill | decompress tok/s | "
          "vLLM greedy tok/s (same parallelism) | × greedy | exact | coder share of a decode step | exact model | "
          f"{LATENCY_BYTES // 1024} KB round trip |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind in args.kinds.split(","):
        for row in asyncio.run(run_kind(kind, sources[kind](args.bytes), args, headers)):
            print(row, flush=True)


if __name__ == "__main__":
    main()
