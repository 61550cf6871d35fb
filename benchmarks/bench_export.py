"""Top-k export throughput: positions/s against plain prefill and vLLM's own ``prompt_logprobs``.

    python benchmarks/bench_export.py --url http://127.0.0.1:8000 [--api-key KEY] [--top-k 100]
    python benchmarks/bench_export.py --engine            # the same comparison inside one vLLM engine
    python benchmarks/bench_export.py --url URL --corpus-mb 10 --server-pid PID   # memory while exporting

HTTP mode sends the same token windows (held-out stdlib code) as plain one-token completions
(the prefill baseline), as binary exports and as JSON exports, at 1 and 8 concurrent requests.
Engine mode times one ``LLM.generate`` over all windows for: plain prefill, ``prompt_logprobs=k``
(vLLM's raw path) and the export (``prompt_logprobs=k`` + Cascade's processing hook, temperature
0.8 and top-p 0.95 so the stack does work). Every row's ratio is against the prefill baseline
measured in the same run. Corpus mode exports a corpus of stdlib files (``cascade export-topk``'s
code path) and samples the gateway's and its own resident memory, which must stay flat.
"""

from __future__ import annotations

import argparse
import asyncio
import sysconfig
import time
from pathlib import Path
from typing import Any

import httpx

HELD_OUT = ["json/decoder.py", "email/message.py", "http/client.py", "asyncio/base_events.py", "argparse.py"]
MODEL_DIR = Path(__file__).resolve().parents[1] / "models" / "pycoder-23m"


def corpus_text() -> str:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return "".join((stdlib / name).read_text() for name in HELD_OUT)


def token_windows(ids: list[int], window: int, count: int) -> list[list[int]]:
    return [ids[i: i + window] for i in range(0, len(ids) - window, window)][:count]


async def http_mode(args: argparse.Namespace) -> None:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=600) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
        ids = (await client.post("/v1/tokenize", json={"model": model, "prompt": corpus_text()})).json()["tokens"]
        windows = token_windows(ids, args.window, args.windows)
        common = {"model": model, "compression": True, "compression_top_k": args.top_k, "temperature": 0.8,
                  "top_p": 0.95}
        kinds: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
            "plain prefill (max_tokens=1)": ({"model": model, "max_tokens": 1}, {}),
            f"export binary k={args.top_k}": (common, {"Accept": "application/octet-stream"}),
            f"export JSON k={args.top_k}": (common, {}),
        }

        salt = iter(range(100, 10**6))

        async def run(body: dict[str, Any], extra: dict[str, str], concurrency: int) -> float:
            """A fresh first token per run and window, so no run reads another's prefix cache."""
            sem = asyncio.Semaphore(concurrency)
            first = next(salt)

            async def one(window: list[int]) -> None:
                async with sem:
                    prompt = [first, *window[1:]]
                    response = await client.post("/v1/completions", json={**body, "prompt": prompt}, headers=extra)
                    response.raise_for_status()
                    _ = response.content

            start = time.perf_counter()
            await asyncio.gather(*(one(w) for w in windows))
            return sum(len(w) - 1 for w in windows) / (time.perf_counter() - start)

        await run(kinds["plain prefill (max_tokens=1)"][0], {}, 2)
        print(f"\n{len(windows)} windows of {args.window} tokens, HTTP, top-k {args.top_k}\n")
        print("| what | clients | positions/s | ratio to prefill |")
        print("|---|---:|---:|---:|")
        for concurrency in (1, 8):
            base = None
            for name, (body, extra) in kinds.items():
                rate = await run(body, extra, concurrency)
                base = base or rate
                print(f"| {name} | {concurrency} | {rate:,.0f} | {rate / base:.2f} |", flush=True)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def build_corpus(directory: Path, megabytes: float) -> int:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    total, target = 0, int(megabytes * 1e6)
    for n, source in enumerate(sorted(stdlib.rglob("*.py"))):
        if total >= target:
            break
        try:
            data = source.read_bytes()
            data.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        (directory / f"{n:05d}.py").write_bytes(data[: target - total])
        total += min(len(data), target - total)
    return total


async def corpus_mode(args: argparse.Namespace) -> None:
    import os
    import tempfile

    from cascade_client.topk_export import TopkExporter

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus"
        corpus.mkdir()
        size = build_corpus(corpus, args.corpus_mb)
        out = Path(tmp) / "out.bin"
        async with httpx.AsyncClient(base_url=args.url, headers=headers, timeout=600) as client:
            model = (await client.get("/v1/models")).json()["data"][0]["id"]
            exporter = TopkExporter(client, args.top_k, model=model, concurrency=8)
            samples: list[tuple[float, float, float]] = []
            start = time.perf_counter()

            async def sample() -> None:
                while True:
                    samples.append((time.perf_counter() - start, rss_mb(args.server_pid), rss_mb(os.getpid())))
                    await asyncio.sleep(5)

            sampler = asyncio.ensure_future(sample())
            with out.open("wb") as sink:
                stats = await exporter.run([corpus], sink)
            sampler.cancel()
            wall = time.perf_counter() - start
        samples.append((wall, rss_mb(args.server_pid), rss_mb(os.getpid())))
        print(f"\nexported {size / 1e6:.1f} MB ({stats.tokens:,} tokens, {stats.files} files) at top-k {args.top_k}: "
              f"{stats.positions:,} positions in {wall:.0f} s = {stats.positions / wall:,.0f} positions/s, "
              f"{stats.output_bytes / 1e6:.0f} MB written\n")
        print("| seconds | gateway RSS MB | exporter RSS MB |")
        print("|---:|---:|---:|")
        step = max(1, len(samples) // 12)
        for t, gateway, client_rss in samples[::step] + ([samples[-1]] if (len(samples) - 1) % step else []):
            print(f"| {t:.0f} | {gateway:.0f} | {client_rss:.0f} |")


def engine_mode(args: argparse.Namespace) -> None:
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(MODEL_DIR), dtype="float32", max_model_len=2048, kv_cache_memory_bytes=256 << 20,
              enforce_eager=True, max_logprobs=-1, enable_prefix_caching=False)
    ids = llm.get_tokenizer().encode(corpus_text(), add_special_tokens=False)
    windows = [{"prompt_token_ids": w} for w in token_windows(ids, args.window, args.windows)]
    k = args.top_k
    cases = {
        "plain prefill (max_tokens=1)": SamplingParams(max_tokens=1, detokenize=False),
        f"vLLM prompt_logprobs={k} (raw)": SamplingParams(max_tokens=1, prompt_logprobs=k, detokenize=False),
        f"vLLM prompt_logprobs={k} (raw, flat_logprobs)": SamplingParams(max_tokens=1, prompt_logprobs=k,
                                                                        detokenize=False, flat_logprobs=True),
        f"Cascade export k={k} (processed, flat, as served)": SamplingParams(
            max_tokens=1, prompt_logprobs=k, detokenize=False, temperature=0.8, top_p=0.95, flat_logprobs=True,
            extra_args={"cascade_export": True}),
    }
    llm.generate(windows[:2], cases["plain prefill (max_tokens=1)"], use_tqdm=False)
    positions = sum(len(w["prompt_token_ids"]) - 1 for w in windows)
    print(f"\n{len(windows)} windows of {args.window} tokens, one engine (LLM.generate)\n")
    print("| what | positions/s | ratio to prefill |")
    print("|---|---:|---:|")
    base = None
    for name, params in cases.items():
        start = time.perf_counter()
        llm.generate(windows, params, use_tqdm=False)
        rate = positions / (time.perf_counter() - start)
        base = base or rate
        print(f"| {name} | {rate:,.0f} | {rate / base:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--api-key")
    parser.add_argument("--engine", action="store_true", help="compare inside one vLLM engine instead of HTTP")
    parser.add_argument("--top-k", type=int, default=100)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument("--windows", type=int, default=16)
    parser.add_argument("--corpus-mb", type=float, help="export a corpus this large and watch memory")
    parser.add_argument("--server-pid", type=int, default=0, help="the gateway's pid (for its RSS)")
    args = parser.parse_args()
    if args.engine:
        engine_mode(args)
    elif args.corpus_mb:
        asyncio.run(corpus_mode(args))
    else:
        asyncio.run(http_mode(args))


if __name__ == "__main__":
    main()
