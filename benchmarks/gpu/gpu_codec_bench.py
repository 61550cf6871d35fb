#!/usr/bin/env python3
"""GPU measurements of Cascade's codec on vLLM (bench-only; how to rerun: README.md in this folder).

Subcommands (each one runs in its own process, because VLLM_BATCH_INVARIANT must be set before the
engine starts):

  build OUT                      random-weight Llama (h=2048, 16 layers, ~0.85B) with pycoder's tokenizer
  det   --model M --dtype D      determinism of the codec's top-k log-probabilities:
                                   (a) prefill (prompt_logprobs), alone and batched,
                                   (b) decode (teacher forcing through the codec's logits processor) alone,
                                   (c) decode batched with the other segments and unrelated requests;
                                 then exact round trips through Cascade's EngineCodec / CodecPipeline with
                                 many concurrent requests, and the prefill-compress fast path
  tput  --dtype D                compress / decompress throughput of CodecPipeline on >= 1 MB texts, with
                                 plain prefill and plain greedy decoding of the same segments as baselines

It drives vLLM's AsyncLLM with Cascade's codec modules directly (pure core, vllm_logits_processor.py,
engine_codec.py, pipeline.py), not the HTTP service: the service's EngineManager and the vLLM plugin
check for vLLM 0.32 and the GPU machine runs vLLM 0.26.

BENCH-ONLY WORKAROUND (clearly not production): this script never installs the cascade package, so
neither of its entry points (the version-checked ``vllm.general_plugins`` plugin, the
``vllm.logits_processors`` processor) exists there; VLLM_PLUGINS is also set to a name that matches
no plugin. The codec logits processor is handed to the engine explicitly (``logits_processors=``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import lzma
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "service"))

for _k, _v in {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", "VLLM_USE_FLASHINFER_SAMPLER": "0",
               "VLLM_PLUGINS": "no-plugin-on-purpose"}.items():
    os.environ.setdefault(_k, _v)


def _stub_engine_config() -> None:
    """Bench-only: cascade.codec.engine_codec needs only EngineRole from cascade.engine.config, whose
    import pulls in the service settings (pydantic-settings, not carried to the GPU machine)."""
    try:
        import pydantic_settings  # noqa: F401
    except ImportError:
        import enum
        import types

        mod = types.ModuleType("cascade.engine.config")

        class EngineRole(enum.StrEnum):
            MAIN = "main"
            PREDICT = "predict"
            CODEC = "codec"

        mod.EngineRole = EngineRole  # type: ignore[attr-defined]
        sys.modules["cascade.engine.config"] = mod


_stub_engine_config()
T0 = time.monotonic()
MODE = "batch_invariant" if os.environ.get("VLLM_BATCH_INVARIANT", "0") not in ("", "0") else "default"


def log(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s {MODE}] {msg}", flush=True)


def data_dir() -> Path:
    return Path(os.environ.get("CASCADE_GPU_DATA", REPO / ".gpu" / "data"))


def load_text(name: str) -> bytes:
    path = data_dir() / f"{name}.txt.xz"
    if path.exists():
        return lzma.decompress(path.read_bytes())
    return (data_dir() / f"{name}.txt").read_bytes()


# ---------------------------------------------------------------------------------------------- engine


class BenchEngines:
    """The slice of cascade.engine.manager.EngineManager that CodecPipeline/EngineCodec use, over one
    AsyncLLM (bench-only: the real manager refuses vLLM != 0.32)."""

    def __init__(self, llm: Any, fingerprint: bytes) -> None:
        self.llm = llm
        self.fingerprint = fingerprint
        self.tokenizer = llm.get_tokenizer()

    async def generate(self, prompt_token_ids: Any, params: Any, request_id: str, role: Any = None) -> Any:
        finished = False
        try:
            async for output in self.llm.generate({"prompt_token_ids": list(prompt_token_ids)}, params, request_id):
                finished = output.finished
                yield output
        finally:
            if not finished:
                await self.llm.abort(request_id)


def make_engine(model: str, dtype: str, max_num_seqs: int, memory: float) -> Any:
    from cascade.codec.vllm_logits_processor import CodecLogitsProcessor
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    t = time.monotonic()
    kwargs: dict[str, Any] = dict(model=model, dtype=dtype, max_model_len=1024, enforce_eager=True, seed=0,
                                  gpu_memory_utilization=memory, max_num_seqs=max_num_seqs, max_logprobs=-1,
                                  enable_prefix_caching=False, disable_log_stats=True,
                                  logits_processors=[CodecLogitsProcessor])
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
    log(f"engine up in {time.monotonic() - t:.1f}s: model={model} dtype={dtype} max_num_seqs={max_num_seqs}")
    return llm


def env_info() -> dict[str, Any]:
    import torch
    import vllm

    info: dict[str, Any] = {"vllm": vllm.__version__, "torch": torch.__version__, "mode": MODE}
    if torch.cuda.is_available():
        info["device"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


# ------------------------------------------------------------------------------------ logprob helpers

_RID = 0


def rid(prefix: str) -> str:
    global _RID
    _RID += 1
    return f"{prefix}-{_RID}"


def canonical(logprobs: Any, k: int, actual: int) -> tuple[tuple[int, ...], tuple[float, ...]]:
    from cascade.codec.engine_codec import topk_entries

    ids, values = topk_entries(dict(logprobs.items()), k, actual)
    return tuple(ids), tuple(values)


Rows = list[tuple[tuple[int, ...], tuple[float, ...]]]


async def prefill_topk(engines: BenchEngines, prompt: list[int], k: int) -> Rows:
    """Top-k for every prompt position after the first (teacher forcing through one prefill)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k, detokenize=False,
                            output_kind=RequestOutputKind.FINAL_ONLY)
    out = None
    async for out in engines.generate(prompt, params, rid("prefill")):  # noqa: B007 (the last output is kept)
        pass
    assert out is not None and out.prompt_logprobs is not None
    return [canonical(out.prompt_logprobs[j], k, prompt[j]) for j in range(1, len(prompt))]


async def decode_topk(engines: BenchEngines, prompt: list[int], tokens: list[int],
                      k: int) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    """Top-k for every forced token, through decode steps and the codec's logits processor (force mode),
    exactly as EngineCodec.encode reads them."""
    from cascade.codec.params import CodecArgs
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    args = CodecArgs("force", top_k=k, precision_bits=32, tokens=list(tokens))
    params = SamplingParams(max_tokens=len(tokens), temperature=0.0, logprobs=k, ignore_eos=True, detokenize=False,
                            output_kind=RequestOutputKind.DELTA, extra_args=args.to_extra_args())
    rows = []
    async for out in engines.generate(prompt, params, rid("decode")):
        c = out.outputs[0]
        for token, lps in zip(c.token_ids, c.logprobs or [], strict=True):
            assert token == tokens[len(rows)], "forced token not emitted"
            rows.append(canonical(lps, k, token))
    assert len(rows) == len(tokens)
    return rows


async def filler(engines: BenchEngines, seed: int, vocab: int) -> int:
    """An unrelated sampled request, to change the batch's composition."""
    from vllm import SamplingParams

    rng = random.Random(seed)
    prompt = [rng.randrange(3, vocab) for _ in range(rng.randrange(8, 300))]
    params = SamplingParams(max_tokens=rng.randrange(16, 400), temperature=1.0, seed=seed, ignore_eos=True,
                            detokenize=False)
    n = 0
    async for out in engines.generate(prompt, params, rid("filler")):
        n = len(out.outputs[0].token_ids)
    return n


def compare(x: list, y: list) -> dict[str, Any]:
    """Bit-level comparison of two runs' top-k rows (canonically ordered ids and float logprobs)."""
    from cascade.codec.distribution import quantise

    n = len(x)
    ids_diff = vals_diff = table_diff = 0
    max_abs = 0.0
    for (ia, va), (ib, vb) in zip(x, y, strict=True):
        if ia != ib:
            ids_diff += 1
        if ia != ib or va != vb:
            vals_diff += 1
        if ia != ib or list(quantise(va)) != list(quantise(vb)):
            table_diff += 1
        da, db = dict(zip(ia, va, strict=False)), dict(zip(ib, vb, strict=False))
        for t in set(da) & set(db):
            max_abs = max(max_abs, abs(da[t] - db[t]))
    return {"positions": n, "bit_identical": vals_diff == 0, "rows_differing": vals_diff,
            "topk_order_or_set_differing": ids_diff, "codec_tables_differing": table_diff,
            "max_abs_logprob_diff": max_abs}


# ------------------------------------------------------------------------------------------ subcommands


def cmd_build(out: str) -> None:
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (Path(out) / "config.json").exists():
        log(f"{out} exists")
        return
    t = time.monotonic()
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=8192, hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                      num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=2048,
                      bos_token_id=0, eos_token_id=1, pad_token_id=2, tie_word_embeddings=False)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        model.lm_head.weight.mul_(8)  # sharper next-token distributions than the 0.02-std init gives
    model.save_pretrained(out)
    src = REPO / "models" / "pycoder-23m"
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(src / f, Path(out) / f)
    n = sum(p.numel() for p in model.parameters())
    log(f"built {out}: {n / 1e6:.0f}M parameters in {time.monotonic() - t:.1f}s")


async def cmd_det(a: argparse.Namespace) -> dict[str, Any]:
    from cascade.codec.engine_codec import EngineCodec
    from cascade.codec.pipeline import CodecPipeline
    from cascade.codec.range_coder import Encoder
    from cascade.codec.topk_coding import encode_next_token
    from cascade.engine.fingerprint import model_fingerprint

    res: dict[str, Any] = {"model": a.model, "dtype": a.dtype, "k": a.k, **env_info()}
    llm = make_engine(a.model, a.dtype, a.max_num_seqs, a.memory)
    res["engine_start_s"] = round(time.monotonic() - T0, 1)
    engines = BenchEngines(llm, model_fingerprint(a.model))
    tok = engines.tokenizer
    sep = int(tok.eos_token_id)
    vocab = len(tok)
    code = load_text("code").decode()
    ids = list(tok.encode(code[:200000], add_special_tokens=False))
    segs = [ids[i * a.length:(i + 1) * a.length] for i in range(a.n)]
    prompts = [[sep, *s] for s in segs]
    k = a.k
    try:
        # (a) prefill, alone then batched (with fillers)
        t = time.monotonic()
        pre_alone = [await prefill_topk(engines, p, k) for p in prompts]
        pre_batch = (await asyncio.gather(*(prefill_topk(engines, p, k) for p in prompts),
                                          *(filler(engines, 100 + i, vocab) for i in range(a.fillers))))[:a.n]
        # (b) decode alone, (c) decode batched with the other segments and unrelated requests
        dec_alone = [await decode_topk(engines, [sep], s, k) for s in segs]
        dec_batch = (await asyncio.gather(*(decode_topk(engines, [sep], s, k) for s in segs),
                                          *(filler(engines, 200 + i, vocab) for i in range(a.fillers))))[:a.n]
        log(f"top-k runs took {time.monotonic() - t:.1f}s")
        flat = lambda runs: [row for run in runs for row in run]  # noqa: E731
        res["compare"] = {
            "prefill_alone_vs_prefill_batched": compare(flat(pre_alone), flat(pre_batch)),
            "decode_alone_vs_decode_batched": compare(flat(dec_alone), flat(dec_batch)),
            "prefill_alone_vs_decode_alone": compare(flat(pre_alone), flat(dec_alone)),
            "prefill_batched_vs_decode_batched": compare(flat(pre_batch), flat(dec_batch)),
        }
        for name, c in res["compare"].items():
            log(f"{name}: {c}")

        # Round trips through Cascade's engine adapter, per segment (top_k/precision as the codec's defaults).
        codec = EngineCodec(engines, vocab, sep)  # type: ignore[arg-type]
        rt_k, prec = a.codec_top_k, 32
        rt_segs = [ids[i * 512:(i + 1) * 512] for i in range(a.rt_segments)]

        async def enc(s: list[int], i: int) -> bytes:
            return (await codec.encode(s, [], rt_k, prec, rid(f"enc{i}"))).payload

        async def dec(p: bytes, n: int, i: int) -> list[int]:
            return await codec.decode(p, n, [], rt_k, prec, rid(f"dec{i}"))

        def count(decoded: list[list[int]]) -> dict[str, Any]:
            bad = [i for i, (d, s) in enumerate(zip(decoded, rt_segs, strict=False)) if d != s]
            first = None
            if bad:
                d, s = decoded[bad[0]], rt_segs[bad[0]]
                first = next((j for j, (x, y) in enumerate(zip(d, s, strict=False)) if x != y), min(len(d), len(s)))
            return {"segments": len(decoded), "exact": len(decoded) - len(bad),
                    "first_bad_segment": bad[0] if bad else None, "first_bad_token": first}

        t = time.monotonic()
        fill = [asyncio.ensure_future(filler(engines, 300 + i, vocab)) for i in range(a.fillers)]
        pay_batch = await asyncio.gather(*(enc(s, i) for i, s in enumerate(rt_segs)))
        pairs = list(enumerate(zip(pay_batch, rt_segs, strict=True)))
        back_batch = await asyncio.gather(*(dec(p, len(s), i) for i, (p, s) in pairs),
                                          *(filler(engines, 400 + i, vocab) for i in range(a.fillers)))
        await asyncio.gather(*fill)
        res["roundtrip_encode_batched_decode_batched"] = count(list(back_batch[:len(rt_segs)]))
        pay_alone = [await enc(s, i) for i, s in enumerate(rt_segs[: a.rt_alone])]
        pairs = list(enumerate(zip(pay_alone, rt_segs, strict=False)))
        back_alone_batch = await asyncio.gather(*(dec(p, len(s), i) for i, (p, s) in pairs))
        same = sum(x == y for x, y in zip(pay_alone, pay_batch, strict=False))
        res["encode_alone_same_bytes_as_encode_batched"] = same
        res["roundtrip_encode_alone_decode_batched"] = count(list(back_alone_batch))

        # Fast path of the design (not what Cascade ships): compress from ONE batched prefill
        # (prompt_logprobs), decompress through decode steps.
        tops = await asyncio.gather(*(prefill_topk(engines, [sep, *s], rt_k) for s in rt_segs))
        pay_pre = []
        for s, top in zip(rt_segs, tops, strict=True):
            e, buf = Encoder(), bytearray()
            for tokid, (i_, v_) in zip(s, top, strict=True):
                buf += encode_next_token(e, list(i_), list(v_), tokid, vocab, prec)
            buf += e.finish()
            pay_pre.append(bytes(buf))
        pairs = list(enumerate(zip(pay_pre, rt_segs, strict=True)))
        back_pre = await asyncio.gather(*(dec(p, len(s), i) for i, (p, s) in pairs))
        res["roundtrip_prefill_encode_decode_batched"] = count(list(back_pre))
        res["prefill_payload_equals_decode_payload"] = sum(x == y for x, y in zip(pay_pre, pay_batch, strict=False))
        log(f"per-segment round trips took {time.monotonic() - t:.1f}s")
        for key in ("roundtrip_encode_batched_decode_batched", "roundtrip_encode_alone_decode_batched",
                    "roundtrip_prefill_encode_decode_batched"):
            log(f"{key}: {res[key]}")

        # The whole pipeline (segmenter, container, CRC checks) with many concurrent segments, plus its
        # startup self-test.
        pipe = CodecPipeline(engines, a.dtype, 1024, window=a.max_num_seqs)  # type: ignore[arg-type]
        await pipe.self_test()
        res["pipeline_self_test"] = pipe.unavailable_reason or "passed"
        text = code[: a.pipeline_bytes].encode()
        res["pipeline_roundtrip"] = await pipeline_roundtrip(pipe, text, rt_k, engines, vocab, a.fillers)
        log(f"pipeline self-test: {res['pipeline_self_test']}; round trip: {res['pipeline_roundtrip']}")
    finally:
        llm.shutdown()
    return res


def repair_trailer(container: bytes) -> tuple[bytes, bool]:
    """Bench-only workaround for a bug found here and since fixed in the service (see
    tests/unit/codec/test_pipeline_order.py); kept so figures from older builds stay comparable.
    With several segments in flight, CodecPipeline.compress used to update the running CRC in the
    order segments *finished* but emit them in submission order, so the trailer CRC did not match.
    Recompute it over the bytes as emitted (every record keeps its own CRC, and each decoded segment
    is still CRC-checked). Returns (container, was the trailer already valid)."""
    import struct
    import zlib

    body = container[:-4]
    good = struct.pack("<I", zlib.crc32(body))
    return body + good, container[-4:] == good


async def chunks_of(data: bytes, size: int = 1 << 16) -> Any:
    for i in range(0, len(data), size):
        yield data[i:i + size]


async def pipeline_roundtrip(pipe: Any, text: bytes, top_k: int, engines: BenchEngines, vocab: int,
                             fillers: int) -> dict[str, Any]:
    from cascade.codec.pipeline import CompressOptions, CompressStats

    options = CompressOptions(top_k=top_k, precision_bits=32, segment_tokens=768)
    stats = CompressStats()
    container = b"".join([part async for part in pipe.compress(chunks_of(text), options, stats, rid("pc"))])
    container, trailer_ok = repair_trailer(container)
    fill = [asyncio.ensure_future(filler(engines, 500 + i, vocab)) for i in range(fillers)]
    try:
        async def packed() -> Any:
            yield container
        back = b"".join([d async for _, d in pipe.decompress(packed(), rid("pd"))])
        ok, err = back == text, None
    except Exception as exc:  # IntegrityError names the segment
        ok, err = False, f"{type(exc).__name__}: {exc}"
    await asyncio.gather(*fill)
    return {"bytes": len(text), "segments": stats.segments, "tokens": stats.tokens, "container_bytes": len(container),
            "trailer_crc_valid_as_written": trailer_ok, "exact": ok, "error": err}


async def cmd_tput(a: argparse.Namespace) -> dict[str, Any]:
    from cascade.codec.pipeline import CodecPipeline, CompressOptions, CompressStats
    from cascade.codec.segmenter import Segmenter
    from cascade.engine.fingerprint import model_fingerprint
    from vllm import SamplingParams

    res: dict[str, Any] = {"model": a.model, "dtype": a.dtype, "window": a.window, "top_k": a.codec_top_k,
                           **env_info(), "texts": {}}
    llm = make_engine(a.model, a.dtype, a.window, a.memory)
    engines = BenchEngines(llm, model_fingerprint(a.model))
    sep = int(engines.tokenizer.eos_token_id)
    pipe = CodecPipeline(engines, a.dtype, 1024, window=a.window)  # type: ignore[arg-type]
    try:
        await pipe.self_test()
        res["pipeline_self_test"] = pipe.unavailable_reason or "passed"
        log(f"self-test: {res['pipeline_self_test']}")
        pipe.unavailable_reason = None  # measure even if the self-test refused (recorded above)
        for name in a.texts:
            if time.monotonic() - T0 > a.budget_s:
                log(f"time budget spent: {name} skipped")
                res["texts"][name] = "skipped: time budget"
                continue
            data = load_text(name)[: a.bytes]
            r: dict[str, Any] = {"bytes": len(data)}
            res["texts"][name] = r
            # segments exactly as the pipeline cuts them
            limit = min(768, pipe.max_segment_tokens(0))
            seg = Segmenter(pipe.encode_text, pipe.decode_tokens, limit, target_bytes=limit * 3)
            segs = [s.tokens async for s in seg.segments(chunks_of(data)) if s.tokens is not None]
            ntok = sum(len(s) for s in segs)
            r["segments_coded"] = len(segs)
            # plain prefill of the same segments (all submitted at once; max_tokens=1)
            t = time.monotonic()
            p1 = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)

            async def prefill(s: list[int], p1: Any = p1) -> None:
                async for _ in engines.generate([sep, *s], p1, rid("pf")):
                    pass
            await asyncio.gather(*(prefill(s) for s in segs))
            r["prefill_tok_s"] = ntok / (time.monotonic() - t)
            # plain greedy decoding, same number of tokens per segment, `window` segments at a time
            sem = asyncio.Semaphore(a.window)
            gen = 0

            async def greedy(n: int, sem: asyncio.Semaphore = sem) -> None:
                nonlocal gen
                async with sem:
                    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False)
                    out = None
                    async for out in engines.generate([sep], params, rid("gr")):  # noqa: B007
                        pass
                    assert out is not None
                    gen += len(out.outputs[0].token_ids)
            t = time.monotonic()
            await asyncio.gather(*(greedy(len(s)) for s in segs))
            r["greedy_tok_s"] = gen / (time.monotonic() - t)
            log(f"{name}: {len(data)} bytes, {ntok} tokens in {len(segs)} segments; prefill {r['prefill_tok_s']:.0f} "
                f"tok/s, greedy {r['greedy_tok_s']:.0f} tok/s")
            # compress
            options = CompressOptions(top_k=a.codec_top_k, precision_bits=32, segment_tokens=768)
            stats = CompressStats()
            t = time.monotonic()
            container = b"".join([p async for p in pipe.compress(chunks_of(data), options, stats, rid("c"))])
            cs = time.monotonic() - t
            container, r["trailer_crc_valid_as_written"] = repair_trailer(container)
            st = stats.as_dict()
            r.update(tokens=stats.tokens, container_bytes=len(container), bits_per_byte=8 * len(container) / len(data),
                     ideal_bits=stats.ideal_bits, ideal_bits_per_byte=stats.ideal_bits / len(data),
                     payload_bits=stats.payload_bits, raw_segments=stats.raw_segments, compress_s=cs,
                     compress_tok_s=stats.tokens / cs, stats=st)
            log(f"{name}: compress {cs:.1f}s = {stats.tokens / cs:.0f} tok/s, {r['bits_per_byte']:.4f} bits/byte "
                f"(ideal {r['ideal_bits_per_byte']:.4f})")
            # decompress
            t = time.monotonic()
            try:
                async def packed(c: bytes = container) -> Any:
                    yield c
                back = b"".join([d async for _, d in pipe.decompress(packed(), rid("d"))])
                r["exact"], r["error"] = back == data, None
            except Exception as exc:
                r["exact"], r["error"] = False, f"{type(exc).__name__}: {exc}"
            ds = time.monotonic() - t
            r.update(decompress_s=ds, decompress_tok_s=stats.tokens / ds)
            r["compress_over_prefill"] = r["compress_tok_s"] / r["prefill_tok_s"]
            r["decompress_over_greedy"] = r["decompress_tok_s"] / r["greedy_tok_s"]
            log(f"{name}: decompress {ds:.1f}s = {r['decompress_tok_s']:.0f} tok/s, exact={r['exact']} "
                f"{r['error'] or ''}")
    finally:
        llm.shutdown()
    return res


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("out")
    for name in ("det", "tput"):
        s = sub.add_parser(name)
        s.add_argument("--model", default=str(REPO / "models" / "pycoder-23m"))
        s.add_argument("--dtype", default="bfloat16")
        s.add_argument("--memory", type=float, default=0.25)
        s.add_argument("--codec-top-k", type=int, default=1024)
        s.add_argument("--json", help="write the results here")
    d = sub.choices["det"]
    d.add_argument("--k", type=int, default=1024, help="top-k compared (the codec's default)")
    d.add_argument("--n", type=int, default=8, help="segments")
    d.add_argument("--length", type=int, default=256, help="tokens per segment")
    d.add_argument("--fillers", type=int, default=8)
    d.add_argument("--max-num-seqs", type=int, default=64)
    d.add_argument("--rt-segments", type=int, default=24)
    d.add_argument("--rt-alone", type=int, default=4)
    d.add_argument("--pipeline-bytes", type=int, default=40000)
    t = sub.choices["tput"]
    t.add_argument("--window", type=int, default=128)
    t.add_argument("--bytes", type=int, default=1 << 20)
    t.add_argument("--texts", nargs="+", default=["code", "prose"])
    t.add_argument("--budget-s", type=float, default=400)
    a = p.parse_args()
    if a.cmd == "build":
        cmd_build(a.out)
        return
    res = asyncio.run(cmd_det(a) if a.cmd == "det" else cmd_tput(a))
    res["wall_s"] = round(time.monotonic() - T0, 1)
    text = json.dumps(res, indent=1, default=str)
    if a.json:
        Path(a.json).write_text(text)
    print("RESULT " + json.dumps(res, default=str), flush=True)


if __name__ == "__main__":
    main()
