"""Codec size on ≥ 1 MB of held-out code and prose, at prefill speed, against gzip/xz/zstd and the ideal.

    python benchmarks/bench_codec_size.py [--bytes 1048576] [--top-k 1024] [--precision-bits 32]

The served codec codes one token per engine step (so that compression and decompression see
bit-identical distributions), about 90 tokens/s on a 2-core CPU: a megabyte takes an hour each way.
This script measures what the container *would* weigh at ≥ 1 MB in minutes: the same segmenter,
the same ``[</s>]`` conditioning, the same distribution builder and range coder, the same
container writer, but with the engine's top-k read from one prefill per segment
(``prompt_logprobs``) instead of one decode step per token. Prefill and decode log-probabilities
differ by up to ~3e-5 on this CPU (docs/architecture.md), which moves a frequency table by at most
a few units of 2^-16 of the weight; ``--check-bytes`` codes a prefix small enough to compare with
the served codec's real container (``benchmarks/bench_codec.py`` prints it for the same bytes).

Held-out texts (the model card: trained on other stdlib packages and man sections 1 and 8):
code = CPython's json/, email/, http/, asyncio/; prose = man pages of sections 7, 5, 2 rendered with
groff (as ``benchmarks/gpu/make_data.sh`` builds them for the GPU run). Baselines run on the same bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import lzma
import math
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_codec import held_out_code, zstd_size

MODEL = Path(__file__).resolve().parents[1] / "models" / "pycoder-23m"
RENDER = "GROFF_NO_SGR=1 groff -t -man -Tutf8 -rLL=100n -rHY=0 -dAD=l 2>/dev/null | col -bx | sed 's/^       //'"


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
            out += text.rstrip(b"\n") + b"\n</s>"
            if len(out) >= limit:
                return bytes(out[:limit]).decode("utf-8", "ignore").encode()
    return bytes(out)


async def _pieces(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 1 << 16):
        yield data[i:i + (1 << 16)]


def segments_of(data: bytes, tokenizer: Any, segment_tokens: int) -> list[Any]:
    from cascade.codec.segmenter import Segmenter

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    def decode(tokens: list[int]) -> str:
        return str(tokenizer.decode(tokens, skip_special_tokens=False, clean_up_tokenization_spaces=False))

    segmenter = Segmenter(encode, decode, segment_tokens, target_bytes=segment_tokens * 3)

    async def collect() -> list[Any]:
        return [s async for s in segmenter.segments(_pieces(data))]

    return asyncio.run(collect())


def code_segments(llm: Any, segments: list[Any], separator: int, top_k: int, precision: int, vocab: int,
                  batch: int) -> tuple[bytes, int, float, int, float]:
    """(container, payload bytes, ideal bits, tokens, seconds in the engine) for the given segments."""
    from cascade.codec.container import KIND_CODED, KIND_RAW, ContainerWriter, Header
    from cascade.codec.range_coder import Encoder
    from cascade.codec.topk_coding import encode_next_token
    from cascade.engine.fingerprint import model_fingerprint
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=top_k, flat_logprobs=True, detokenize=False)
    writer = ContainerWriter(Header(model_fingerprint(str(MODEL)), precision, top_k, vocab, "float32",
                                    {"separator_id": separator}))
    out = bytearray(writer.header_bytes())
    ideal, tokens, engine_seconds, payloads = 0.0, 0, 0.0, 0
    for first in range(0, len(segments), batch):
        group = segments[first:first + batch]
        coded = [s for s in group if s.tokens is not None]
        started = time.perf_counter()
        results = llm.generate([{"prompt_token_ids": [separator, *s.tokens]} for s in coded], params, use_tqdm=False)
        engine_seconds += time.perf_counter() - started
        by_segment = {id(s): r for s, r in zip(coded, results, strict=True)}
        for segment in group:
            if segment.tokens is None:
                out += writer.segment_bytes(KIND_RAW, 0, segment.data, segment.data)
                continue
            flat = by_segment[id(segment)].prompt_logprobs
            encoder, payload = Encoder(), bytearray()
            for position, token in enumerate(segment.tokens, start=1):
                start, end = flat.start_indices[position], flat.end_indices[position]
                assert flat.token_ids[start] == token and end - start == top_k + 1
                payload += encode_next_token(encoder, flat.token_ids[start + 1:end], flat.logprobs[start + 1:end],
                                             token, vocab, precision)
                ideal -= flat.logprobs[start] / math.log(2)
            payload += encoder.finish()
            payloads += len(payload)
            tokens += len(segment.tokens)
            out += writer.segment_bytes(KIND_CODED, len(segment.tokens), segment.data, bytes(payload))
    return bytes(out + writer.trailer_bytes()), payloads, ideal, tokens, engine_seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bytes", type=int, default=1 << 20)
    parser.add_argument("--top-k", type=int, default=1024)
    parser.add_argument("--precision-bits", type=int, default=32, choices=(16, 24, 32))
    parser.add_argument("--segment-tokens", type=int, default=768)
    parser.add_argument("--batch", type=int, default=4, help="segments per engine call (bounds memory)")
    parser.add_argument("--texts", default="code,prose")
    parser.add_argument("--check-bytes", type=int, help="also code this prefix of the code text (compare with "
                        "bench_codec.py's container for the same bytes)")
    args = parser.parse_args()

    from vllm import LLM

    llm = LLM(model=str(MODEL), dtype="float32", max_model_len=1024, kv_cache_memory_bytes=512 << 20,
              enforce_eager=True, max_logprobs=-1, enable_prefix_caching=False, seed=0)
    tokenizer = llm.get_tokenizer()
    separator, vocab = int(tokenizer.eos_token_id), len(tokenizer)
    texts = {"code": held_out_code, "prose": held_out_prose}
    jobs = [(name, texts[name](args.bytes)) for name in args.texts.split(",")]
    if args.check_bytes:
        jobs.insert(0, (f"code, first {args.check_bytes} bytes", held_out_code(args.check_bytes)))
    for name, data in jobs:
        started = time.perf_counter()
        segments = segments_of(data, tokenizer, args.segment_tokens)
        container, payload, ideal, tokens, engine_seconds = code_segments(llm, segments, separator, args.top_k,
                                                                 args.precision_bits, vocab, args.batch)
        wall = time.perf_counter() - started
        xz = len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
        rows = [("cascade container (prefill-estimated)", len(container)), ("gzip -9", len(gzip.compress(data, 9))),
                ("xz -9e", xz), ("zstd -19 --long", zstd_size(data)), ("model cross-entropy (ideal)", ideal / 8)]
        raw = sum(1 for s in segments if s.tokens is None)
        print(f"\n{name}: {len(data):,} bytes, {tokens:,} tokens, {len(segments)} segments ({raw} raw), "
              f"top_k {args.top_k}, precision {args.precision_bits}; {wall:.0f} s "
              f"({engine_seconds:.0f} s in the engine, {tokens / engine_seconds:,.0f} tokens/s)\n")
        print("| method | bytes | bits/byte | × xz |")
        print("|---|---:|---:|---:|")
        for label, size in rows:
            if size is not None:
                print(f"| {label} | {size:,.0f} | {8 * size / len(data):.3f} | {size / xz:.2f} |")
        print(f"\ncoder overhead over the ideal (coded payloads): {100 * (8 * payload / ideal - 1):.2f} %; "
              f"container framing {len(container) - payload:,} bytes (header, 22 per segment, trailer; raw "
              f"segments count here)", flush=True)


if __name__ == "__main__":
    main()
