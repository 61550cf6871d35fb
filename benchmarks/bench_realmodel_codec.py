"""Exact codec on a real model: bits/byte against xz, zstd and the float model's cross-entropy.

    python benchmarks/bench_realmodel_codec.py [--model smollm2-135m-instruct] [--bytes 8192] [--verify-bytes 1024]

Starts ``cascade serve --model MODEL --no-enable-predictions`` (one engine plus the exact codec) and
compresses ``--bytes`` of code the model cannot have trained on: Cascade's own sources (written in
2026; SmolLM2 was released in 2024). Baselines from the same run and text: ``xz -9e``, zstd at level 19
(the ``zstandard`` package if installed, else the ``zstd`` command, else reported missing) and the
float32 model's cross-entropy (transformers) over the same lanes (``--lane-tokens`` tokens, each
conditioned on the separator token only, as the codec's lanes are). Then a ``--verify-bytes`` piece
goes through /compress and /decompress and must come back byte for byte (decompression on this model
runs at tens of bytes per second on a 2-core CPU: issue 21).
"""

from __future__ import annotations

import argparse
import lzma
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "service"))
sys.path.insert(0, str(REPO))


def held_out_code(limit: int) -> bytes:
    out = bytearray()
    for path in sorted((REPO / "service" / "cascade").rglob("*.py")):
        out += path.read_bytes()
        if len(out) >= limit:
            break
    return bytes(out[:limit]).decode("utf-8", "ignore").encode()


def zstd_size(data: bytes) -> tuple[int | None, str]:
    try:
        import zstandard  # type: ignore[import-not-found]

        return len(zstandard.ZstdCompressor(level=19).compress(data)), "zstandard -19"
    except ImportError:
        pass
    exe = shutil.which("zstd")
    if exe is None:
        return None, "zstd: neither the zstandard package nor the zstd command is installed"
    out = subprocess.run([exe, "-19", "--long", "-c", "-q"], input=data, capture_output=True, check=True).stdout
    return len(out), "zstd -19 --long (command)"


def float_cross_entropy_bits(model_path: str, ids: list[int], lane_tokens: int, separator: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    bits = 0.0
    with torch.no_grad():
        for start in range(0, len(ids), lane_tokens):
            lane = torch.tensor([[separator, *ids[start:start + lane_tokens]]])
            logp = model(lane).logits[0, :-1].double().log_softmax(-1)
            bits -= float(logp.gather(1, lane[0, 1:, None]).sum()) / math.log(2)
    return bits


def payload_bytes(container: bytes) -> int:
    """The range-coded payload alone (the container less its header and segment table)."""
    from cascade.codec.container import parse_container

    return sum(len(segment.payload) for segment in parse_container(container).segments)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--bytes", type=int, default=8192)
    parser.add_argument("--verify-bytes", type=int, default=1024)
    parser.add_argument("--lane-tokens", type=int, default=1000)
    parser.add_argument("--lanes", type=int, default=16)
    args = parser.parse_args()

    from cascade.model_registry import resolve_model
    from transformers import AutoTokenizer

    from tests.integration.conftest import start_service, stop_service

    model = resolve_model(args.model)
    data = held_out_code(args.bytes)
    scratch = Path(f"/tmp/bench-realmodel-codec-{int(time.time())}")
    scratch.mkdir(parents=True)
    service = start_service(scratch, ["--model", model, "--no-enable-predictions"], timeout=900)
    try:
        params = {"lanes": args.lanes, "lane_tokens": args.lane_tokens}
        with httpx.Client(base_url=service.base_url, headers=service.headers, timeout=3600) as client:
            start = time.perf_counter()
            packed = client.post("/compress", content=data, params=params, headers={"content-type": "text/plain"})
            compress_s = time.perf_counter() - start
            packed.raise_for_status()
            piece = data[:args.verify_bytes]
            small = client.post("/compress", content=piece, params={"lanes": 64},
                                headers={"content-type": "text/plain"})
            small.raise_for_status()
            start = time.perf_counter()
            back = client.post("/decompress", content=small.content,
                               headers={"content-type": "application/octet-stream"})
            decompress_s = time.perf_counter() - start
    finally:
        stop_service(service)
    tokenizer = AutoTokenizer.from_pretrained(model)
    ids = tokenizer.encode(data.decode(), add_special_tokens=False)
    separator = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
    ce_bits = float_cross_entropy_bits(model, ids, args.lane_tokens, separator)
    xz = len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    zstd, zstd_how = zstd_size(data)
    bpb = 8 * len(packed.content) / len(data)
    payload_bpb = 8 * payload_bytes(packed.content) / len(data)
    float_bpb = ce_bits / len(data)
    print(f"model {model}, {len(data)} bytes of held-out code, {len(ids)} tokens, lanes of {args.lane_tokens} "
          f"tokens, {args.lanes} lanes a segment; zstd: {zstd_how}")
    print()
    print("| bytes | tokens | container bits/byte | payload bits/byte | float CE bits/byte | payload × float CE | "
          "xz -9e | container × xz | zstd -19 | container × zstd | compress B/s | round trip (bytes) | "
          "decompress B/s | exact |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    zstd_bpb = 8 * zstd / len(data) if zstd is not None else float("nan")
    print(f"| {len(data)} | {len(ids)} | {bpb:.3f} | {payload_bpb:.3f} | {float_bpb:.3f} | "
          f"{payload_bpb / float_bpb:.3f} | "
          f"{8 * xz / len(data):.3f} | {bpb / (8 * xz / len(data)):.3f} | {zstd_bpb:.3f} | {bpb / zstd_bpb:.3f} | "
          f"{len(data) / compress_s:.0f} | {len(piece)} | {len(piece) / decompress_s:.1f} | "
          f"{back.status_code == 200 and back.content == piece} |")


if __name__ == "__main__":
    main()
