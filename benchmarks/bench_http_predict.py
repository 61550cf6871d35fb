"""Predicted outputs through HTTP on a real instruct model: Cascade against vLLM's own OpenAI server with
the proposers a user could switch on instead (n-gram prompt lookup, suffix decoding), at concurrency 1 and 8.

    python benchmarks/bench_http_predict.py                         # 24 chat tasks + 24 from git history
    python benchmarks/bench_http_predict.py --tasks 6 --history 4 --ngram-ks 8,32 --concurrency 1
    python benchmarks/bench_http_predict.py --suffix-python /tmp/arctic-run/bin/python   # + suffix decoding
    python benchmarks/bench_http_predict.py --full-peers none       # calibration only
    python benchmarks/bench_http_predict.py --peers ngram:8,suffix:128 --cascade-once --calibrate-tasks 0 \
        --suffix-python /tmp/arctic-run/bin/python                  # chosen peers, no calibration
    python benchmarks/bench_http_predict.py --check-identical       # prediction = output, default model

``--suffix-python``: vLLM's ``suffix`` method needs Arctic Inference; ``benchmarks/make_suffix_env.sh``
builds it from source into a throwaway venv that sees this venv's packages (torch and vLLM unchanged).

Everything goes over HTTP with the OpenAI SDK (``/v1/chat/completions``, temperature 0), as a user's
client would. Servers: ``cascade serve --model smollm2-135m-instruct`` (main engine and prediction
engine; codec off) stays up the whole run; vLLM's ``vllm.entrypoints.openai.api_server`` with the same
engine arguments (dtype, context, KV cache, seed, eager) and a ``--speculative-config`` runs beside it,
one at a time (start, measure, stop).

Tasks: the 24 chat edit tasks of ``benchmarks/realmodel_tasks.py`` and ``--history`` single-file ``.py``
edits of this repository's history read with git at run time (before-file in the message and as the
prediction, the commit subject as the instruction; nothing copied into the repository).

Arms: "no prediction" = Cascade without ``prediction`` (its main engine: the baseline); "cascade" =
the same request with ``prediction={"type": "content", "content": <original file>}``; a vLLM peer =
the same request without prediction to vLLM's server (its proposer drafts from the prompt and the
output). Tasks run in blocks (1 task at concurrency 1, 2 × concurrency tasks otherwise); within a block
every arm runs the block's tasks (asyncio, a semaphore of ``concurrency``), in an order rotated from
block to block, so load drift on the shared machine hits every arm alike. Aggregate tokens/s = output
tokens / summed block wall time of the arm; × = against no prediction over the same blocks.

First each candidate peer (``--ngram-ks``, ``--suffix-depths``, or ``--peers``) runs on a calibration
subset at concurrency 1 against no prediction; then the full task set runs for n-gram K = 8 and the
best peer of each family (``--full-peers``), each phase measuring no prediction, Cascade and that peer
together (``--cascade-once``: Cascade in the first phase only; later peers are compared with it
through each one's × against no prediction).

Columns: acc = accepted draft tokens / output tokens (Cascade: usage
``completion_tokens_details.accepted_prediction_tokens``; vLLM: its ``/metrics`` counter
``vllm:spec_decode_num_accepted_tokens_total``); drafts ok = accepted / drafted tokens; same = replies
whose text equals the no-prediction reply of the same block.

``--check-identical``: serves the default model (``cascade serve`` with no ``--model``), gets each
prompt's greedy completion without prediction, then alternates requests without and with that very
text as the prediction (``/v1/completions``); the target is ≥ 10× tokens/s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent / "service"), str(BENCH)]

from http_servers import Server, free_port, start_cascade, start_vllm, stop_server  # noqa: E402
from realmodel_tasks import history_tasks, tasks  # noqa: E402

BASE = "no prediction"
CASCADE = "cascade"
CHECK_PROMPTS = ["import os\n\ndef ", "class Config:\n    def __init__(self", "def parse_args(argv):\n",
                 "import json\n\n\ndef load"]


@dataclass(frozen=True)
class ChatTask:
    name: str
    message: str
    prediction: str


@dataclass(frozen=True)
class Reply:
    text: str
    tokens: int
    accepted: int | None
    rejected: int | None
    seconds: float


@dataclass(frozen=True)
class Arm:
    """One way of sending the tasks: a server, and whether the request carries the prediction."""

    label: str
    client: Any  # openai.AsyncOpenAI
    model: str
    predict: bool
    metrics_url: str | None = None  # a vLLM server's /metrics (spec-decode counters)
    user: str | None = None  # Cascade: the response-cache scope of the requests (OpenAI ``user``)


@dataclass
class Tally:
    """What one arm did over one phase at one concurrency."""

    replies: dict[str, Reply] = field(default_factory=dict)
    seconds: float = 0.0
    drafted: int | None = None  # vLLM: from /metrics
    accepted: int | None = None

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.replies.values())

    def accepted_tokens(self) -> int | None:
        if self.accepted is not None:
            return self.accepted
        counts = [r.accepted for r in self.replies.values()]
        return None if any(c is None for c in counts) else sum(c or 0 for c in counts)

    def drafted_tokens(self) -> int | None:
        if self.drafted is not None:
            return self.drafted
        accepted = self.accepted_tokens()
        rejected = [r.rejected for r in self.replies.values()]
        if accepted is None or any(c is None for c in rejected):
            return None
        return accepted + sum(c or 0 for c in rejected)


@dataclass
class Phase:
    """Arms measured together on a task set, per concurrency."""

    title: str
    tallies: dict[int, dict[str, Tally]] = field(default_factory=dict)


async def chat(arm: Arm, task: ChatTask, max_tokens: int) -> Reply:
    extra: dict[str, Any] = {}
    if arm.predict:
        extra["prediction"] = {"type": "content", "content": task.prediction}
    if arm.user:
        extra["user"] = arm.user
    start = time.perf_counter()
    response = await arm.client.chat.completions.create(
        model=arm.model, messages=[{"role": "user", "content": task.message}], temperature=0,
        max_tokens=max_tokens, **extra)
    usage = response.usage
    details = usage.completion_tokens_details
    accepted = getattr(details, "accepted_prediction_tokens", None) if arm.predict else None
    rejected = getattr(details, "rejected_prediction_tokens", None) if arm.predict else None
    return Reply(response.choices[0].message.content or "", usage.completion_tokens, accepted, rejected,
                 time.perf_counter() - start)


async def spec_counters(url: str | None) -> tuple[int, int] | None:
    """(drafted, accepted) token counters of a vLLM server, summed over engines."""
    if url is None:
        return None
    async with httpx.AsyncClient(timeout=30) as client:
        text = (await client.get(url)).text
    totals = {"draft": 0.0, "accepted": 0.0}
    for line in text.splitlines():
        for key, name in (("draft", "vllm:spec_decode_num_draft_tokens_total"),
                          ("accepted", "vllm:spec_decode_num_accepted_tokens_total")):
            if line.startswith(name + "{") or line.startswith(name + " "):
                totals[key] += float(line.rsplit(" ", 1)[1])
    return int(totals["draft"]), int(totals["accepted"])


async def run_block(arm: Arm, block: Sequence[ChatTask], concurrency: int, max_tokens: int,
                    tally: Tally) -> None:
    semaphore = asyncio.Semaphore(concurrency)

    async def one(task: ChatTask) -> tuple[str, Reply]:
        async with semaphore:
            return task.name, await chat(arm, task, max_tokens)

    before = await spec_counters(arm.metrics_url)
    start = time.perf_counter()
    replies = await asyncio.gather(*(one(task) for task in block))
    tally.seconds += time.perf_counter() - start
    after = await spec_counters(arm.metrics_url)
    tally.replies.update(replies)
    if before is not None and after is not None:
        tally.drafted = (tally.drafted or 0) + after[0] - before[0]
        tally.accepted = (tally.accepted or 0) + after[1] - before[1]


async def measure(arms: list[Arm], items: list[ChatTask], concurrency: int, max_tokens: int,
                  what: str) -> dict[str, Tally]:
    """Every arm over the same blocks of tasks, arm order rotated per block."""
    for arm in arms:  # warm-up: first requests allocate and compile
        await chat(arm, items[0], 8)
    size = 1 if concurrency == 1 else 2 * concurrency
    blocks = [items[i:i + size] for i in range(0, len(items), size)]
    tallies = {arm.label: Tally() for arm in arms}
    for b, block in enumerate(blocks):
        order = arms[b % len(arms):] + arms[:b % len(arms)]
        for arm in order:
            await run_block(arm, block, concurrency, max_tokens, tallies[arm.label])
        line = ", ".join(f"{arm.label} {tallies[arm.label].tokens / max(tallies[arm.label].seconds, 1e-9):.1f}"
                         for arm in arms)
        print(f"  [{what} c={concurrency}] block {b + 1}/{len(blocks)}: tok/s so far {line}",
              file=sys.stderr, flush=True)
    return tallies


def share(part: int | None, whole: int | None) -> str:
    return "–" if part is None or not whole else f"{part / whole:.0%}"


def phase_table(phase: Phase, reference: dict[str, Reply]) -> list[str]:
    rows = [f"**{phase.title}**", "",
            "| c | arm | output tokens | tok/s | × no prediction | acc | drafts ok | same text | "
            "no-prediction text = first run |", "|---|---|---|---|---|---|---|---|---|"]
    for concurrency, tallies in phase.tallies.items():
        base = tallies[BASE]
        base_rate = base.tokens / base.seconds
        for label, tally in tallies.items():
            rate = tally.tokens / tally.seconds
            same = sum(tally.replies[n].text == base.replies[n].text for n in base.replies)
            stable = sum(base.replies[n].text == reference[n].text for n in base.replies if n in reference)
            rows.append(f"| {concurrency} | {label} | {tally.tokens} | {rate:.1f} | {rate / base_rate:.2f} | "
                        f"{share(tally.accepted_tokens(), tally.tokens)} | "
                        f"{share(tally.accepted_tokens(), tally.drafted_tokens())} | {same}/{len(base.replies)} | "
                        f"{stable if label == BASE else ''}{'/' + str(len(base.replies)) if label == BASE else ''} |")
    return rows


def per_task_table(phase: Phase, concurrency: int) -> list[str]:
    """Per task: × against no prediction (request latency; at c = 1 the request had the server to itself),
    Cascade's accepted share and whether every arm's text matched."""
    tallies = phase.tallies[concurrency]
    labels = [label for label in tallies if label != BASE]
    rows = [f"**{phase.title}, per task, c = {concurrency}**", "",
            "| task | tokens | no prediction tok/s | " + " | ".join(f"{lb} ×" for lb in labels) + " | "
            + ("cascade acc | " if CASCADE in tallies else "") + "same text |",
            "|---|---|---|" + "---|" * (len(labels) + 1 + (CASCADE in tallies))]
    for name, reply in tallies[BASE].replies.items():
        cells = [f"{reply.seconds / tallies[lb].replies[name].seconds:.2f}" for lb in labels]
        if CASCADE in tallies:
            cascade_reply = tallies[CASCADE].replies[name]
            cells.append(share(cascade_reply.accepted, cascade_reply.tokens))
        same = all(tallies[lb].replies[name].text == reply.text for lb in labels)
        rows.append(f"| {name} | {reply.tokens} | {reply.tokens / reply.seconds:.1f} | " + " | ".join(cells)
                    + f" | {same} |")
    return rows


def calibration_table(results: dict[str, dict[str, Tally]]) -> list[str]:
    rows = ["| peer (calibration subset, c = 1) | tok/s | no prediction tok/s | × no prediction | acc | "
            "drafts ok | same text |", "|---|---|---|---|---|---|---|"]
    for label, tallies in results.items():
        base, peer = tallies[BASE], tallies[label]
        same = sum(peer.replies[n].text == base.replies[n].text for n in base.replies)
        rows.append(f"| {label} | {peer.tokens / peer.seconds:.1f} | {base.tokens / base.seconds:.1f} | "
                    f"{ratio(tallies, label):.2f} | {share(peer.accepted_tokens(), peer.tokens)} | "
                    f"{share(peer.accepted_tokens(), peer.drafted_tokens())} | {same}/{len(base.replies)} |")
    return rows


def ratio(tallies: dict[str, Tally], label: str) -> float:
    base, arm = tallies[BASE], tallies[label]
    return (arm.tokens / arm.seconds) / (base.tokens / base.seconds)


def target_lines(phases: list[Phase]) -> list[str]:
    """The issue's targets: Cascade ≥ 1.25× the best vLLM proposer at c = 1, ≥ 1× no prediction at c = 8.
    A peer measured in a phase without Cascade is compared through each one's × against no prediction."""
    lines = []
    cascade_x = {c: ratio(t, CASCADE) for phase in phases for c, t in phase.tallies.items() if CASCADE in t}
    for phase in phases:
        for concurrency, tallies in phase.tallies.items():
            for peer in (label for label in tallies if label not in (BASE, CASCADE)):
                if CASCADE in tallies:
                    value = (tallies[CASCADE].tokens / tallies[CASCADE].seconds) / (
                        tallies[peer].tokens / tallies[peer].seconds)
                    how = "tok/s, same blocks"
                elif concurrency in cascade_x:
                    value, how = cascade_x[concurrency] / ratio(tallies, peer), "ratio of × no prediction"
                else:
                    continue
                lines.append(f"- c = {concurrency}: Cascade / {peer} = {value:.2f}× ({how}; target at c = 1: "
                             "≥ 1.25× the best peer)")
    for concurrency, value in cascade_x.items():
        lines.append(f"- c = {concurrency}: Cascade / no prediction = {value:.2f}× (target at c = 8: ≥ 1.00×)")
    return lines


def ngram_peer(k: int, args: argparse.Namespace) -> tuple[str, dict[str, Any], str]:
    return (f"vLLM ngram K={k}", {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": args.ngram_max,
                                  "prompt_lookup_min": args.ngram_min}, sys.executable)


def suffix_peer(depth: int, args: argparse.Namespace) -> tuple[str, dict[str, Any], str]:
    """Depth 24 with K = 24 is vLLM's default suffix decoding."""
    if not args.suffix_python:
        raise SystemExit("suffix decoding needs --suffix-python (an environment with arctic-inference)")
    return (f"vLLM suffix depth {depth} K={min(depth, 64)}", {
        "method": "suffix", "suffix_decoding_max_tree_depth": depth, "num_speculative_tokens": min(depth, 64)},
        args.suffix_python)


def peer_candidates(args: argparse.Namespace) -> list[tuple[str, dict[str, Any], str]]:
    """(label, speculative config, python) of every peer: ``--peers`` as given (in that order), else the
    n-gram Ks and, with ``--suffix-python``, the suffix depths."""
    if args.peers:
        kinds = {"ngram": ngram_peer, "suffix": suffix_peer}
        return [kinds[kind](int(value), args) for kind, value in (p.split(":") for p in args.peers.split(","))]
    out = [ngram_peer(k, args) for k in map(int, args.ngram_ks.split(","))]
    if args.suffix_python:
        out += [suffix_peer(d, args) for d in map(int, args.suffix_depths.split(","))]
    return out


def choose_peers(candidates: list[tuple[str, dict[str, Any], str]], calibration: dict[str, dict[str, Tally]],
                 how: str) -> list[tuple[str, dict[str, Any], str]]:
    """Peers of the full run: the first candidate (n-gram K = 8) always; then, from the calibration, the
    best of each family ("each") or the single best peer ("best"); "none": calibration only. Without a
    calibration every candidate runs."""
    if how == "none":
        return []
    if not calibration:
        return candidates
    by_ratio = sorted(candidates, key=lambda c: -ratio(calibration[c[0]], c[0]))
    families = ("ngram", "suffix") if how == "each" else ("",)
    chosen = [candidates[0]]
    for family in families:
        best = next((c for c in by_ratio if family in c[0]), None)
        if best is not None and best not in chosen:
            chosen.append(best)
    return chosen


def vllm_engine_flags(settings: Any) -> dict[str, Any]:
    """vLLM server flags matching Cascade's main engine (same dtype, context, KV cache, seed, batch)."""
    from cascade.engine.config import EngineRole, engine_kwargs

    kwargs = engine_kwargs(settings, EngineRole.MAIN)
    flags: dict[str, Any] = {"dtype": kwargs["dtype"], "max-model-len": kwargs["max_model_len"],
                             "gpu-memory-utilization": kwargs["gpu_memory_utilization"], "seed": kwargs["seed"],
                             "max-num-seqs": kwargs["max_num_seqs"]}
    if kwargs.get("enforce_eager"):
        flags["enforce-eager"] = True
    if kwargs.get("kv_cache_memory_bytes"):
        flags["kv-cache-memory-bytes"] = kwargs["kv_cache_memory_bytes"]
    return flags


def client_for(server: Server) -> Any:
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0, timeout=1800)


async def run_edits(args: argparse.Namespace) -> None:
    from cascade.model_registry import resolve_model
    from cascade.settings import Settings

    items = [ChatTask(*t) for t in tasks()[:args.tasks]]
    items += [ChatTask(*t) for t in history_tasks(args.history, args.history_min_bytes, args.history_max_bytes,
                                                  args.history_rev)]
    print(f"{len(items)} tasks ({min(args.tasks, 24)} chat edit tasks, {len(items) - min(args.tasks, 24)} from "
          f"git history at {args.history_rev}: {', '.join(t.name for t in items[min(args.tasks, 24):])})",
          file=sys.stderr)
    model_path = resolve_model(args.model)
    cascade_flags = ["--max-model-len", str(args.max_model_len), "--kv-cache-mib", str(args.kv_cache_mib),
                     "--no-enable-codec", "--served-model-name", args.model]
    settings = Settings(model=model_path, served_model_name=args.model, max_model_len=args.max_model_len,
                        kv_cache_mib=args.kv_cache_mib)
    flags = vllm_engine_flags(settings)
    calibration_items = items[::max(1, len(items) // max(args.calibrate_tasks, 1))][:args.calibrate_tasks]
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    log_dir = Path(args.log_dir)
    cascade = start_cascade(args.model, free_port(), log_dir, cascade_flags)
    calibration: dict[str, dict[str, Tally]] = {}
    phases: list[Phase] = []
    reference: dict[str, Reply] = {}
    try:
        base = Arm(BASE, client_for(cascade), args.model, predict=False)
        predicted = Arm(CASCADE, client_for(cascade), args.model, predict=True)

        async def with_peer(label: str, spec: dict[str, Any], python: str, arms: list[Arm], items: list[ChatTask],
                            levels: list[int]) -> dict[int, dict[str, Tally]]:
            """A fresh peer server per concurrency level: suffix decoding caches earlier responses, and
            the same tasks answered again would be drafted from its cache. Cascade caches them too (per
            ``user``): its arm gets a fresh ``user`` per run of the tasks, a fresh cache."""
            out = {}
            for concurrency in levels:
                server = await asyncio.to_thread(start_vllm, model_path, args.model, free_port(), log_dir, flags,
                                                 spec, python, re.sub(r"\W+", "-", label))
                try:
                    peer = Arm(label, client_for(server), args.model, predict=False,
                               metrics_url=server.base_url + "/metrics")
                    fresh = [replace(arm, user=f"{label} c={concurrency}") if arm.predict else arm for arm in arms]
                    out[concurrency] = await measure([*fresh, peer], items, concurrency, args.max_tokens, label)
                finally:
                    await asyncio.to_thread(stop_server, server)
            return out

        print(f"model {args.model}, {len(items)} tasks, max_tokens {args.max_tokens}, temperature 0; Cascade "
              f"flags {' '.join(cascade_flags)}; vLLM flags {flags}\n", flush=True)
        candidates = peer_candidates(args)
        if args.calibrate_tasks:
            for label, spec, python in list(candidates):
                try:
                    calibration[label] = (await with_peer(label, spec, python, [base], calibration_items, [1]))[1]
                except RuntimeError as exc:  # a peer that cannot start is reported, not fatal
                    print(f"{label} did not run: {str(exc)[-1500:]}\n", flush=True)
                    candidates.remove((label, spec, python))
            print(f"calibration on {len(calibration_items)} tasks: {', '.join(t.name for t in calibration_items)}\n")
            print("\n".join(calibration_table(calibration)) + "\n", flush=True)
        chosen = choose_peers(candidates, calibration, args.full_peers)
        for i, (label, spec, python) in enumerate(chosen):
            arms = [base, predicted] if i == 0 or not args.cascade_once else [base]
            phase = Phase(f"{len(items)} tasks, vs {label}")
            phase.tallies = await with_peer(label, spec, python, arms, items, concurrencies)
            if not reference:
                reference = phase.tallies[concurrencies[0]][BASE].replies
            phases.append(phase)
            print("\n".join(phase_table(phase, reference)) + "\n", flush=True)
    finally:
        await asyncio.to_thread(stop_server, cascade)

    print("\n".join(target_lines(phases)))
    if args.save_replies:
        Path(args.save_replies).write_text(json.dumps(
            {phase.title: {str(c): {label: {name: asdict(reply) for name, reply in tally.replies.items()}
                                    for label, tally in tallies.items()}
                           for c, tallies in phase.tallies.items()} for phase in phases}, indent=1))
    if args.per_task:
        for phase in phases:
            print("\n".join(per_task_table(phase, concurrencies[0])))


async def run_check_identical(args: argparse.Namespace) -> None:
    """Prediction = the greedy output, on the default model, through /v1/completions."""
    server = start_cascade(None, free_port(), Path(args.log_dir), ["--no-enable-codec"])
    try:
        client = client_for(server)
        model = (await client.models.list()).data[0].id

        async def complete(prompt: str, prediction: str | None) -> tuple[float, Any]:
            extra = {"extra_body": {"prediction": {"type": "content", "content": prediction}}} if prediction else {}
            start = time.perf_counter()
            response = await client.completions.create(model=model, prompt=prompt, max_tokens=args.check_tokens,
                                                       temperature=0, **extra)
            return time.perf_counter() - start, response

        rows = []
        totals = {"plain": [0.0, 0], "predicted": [0.0, 0]}
        for prompt in CHECK_PROMPTS:
            await complete(prompt, None)  # warm-up
            _, first = await complete(prompt, None)
            greedy = first.choices[0].text
            plain_s, predicted_s, same, accepted, tokens = [], [], True, 0, first.usage.completion_tokens
            for _ in range(args.check_rounds):
                seconds, plain = await complete(prompt, None)
                plain_s.append(seconds)
                seconds, predicted = await complete(prompt, greedy)
                predicted_s.append(seconds)
                same &= plain.choices[0].text == greedy == predicted.choices[0].text
                details = predicted.usage.completion_tokens_details
                accepted = getattr(details, "accepted_prediction_tokens", 0) or 0
            totals["plain"][0] += statistics.median(plain_s)
            totals["predicted"][0] += statistics.median(predicted_s)
            totals["plain"][1] += tokens
            totals["predicted"][1] += tokens
            rows.append(f"| {prompt!r} | {tokens} | {tokens / statistics.median(plain_s):.1f} | "
                        f"{tokens / statistics.median(predicted_s):.1f} | "
                        f"{statistics.median(plain_s) / statistics.median(predicted_s):.2f} | "
                        f"{min(plain_s) / min(predicted_s):.2f} | {share(accepted, tokens)} | {same} |")
    finally:
        stop_server(server)
    print(f"default model ({model}), /v1/completions, temperature 0, max_tokens {args.check_tokens}, "
          f"{args.check_rounds} rounds alternating without / with prediction = the greedy output")
    print()
    print("| prompt | tokens | no prediction tok/s (median) | prediction = output tok/s (median) | × (medians) | "
          "× (best of each) | acc | text identical |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    plain_rate = totals["plain"][1] / totals["plain"][0]
    predicted_rate = totals["predicted"][1] / totals["predicted"][0]
    print(f"| all prompts | {totals['plain'][1]} | {plain_rate:.1f} | {predicted_rate:.1f} | "
          f"{predicted_rate / plain_rate:.2f} | | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="registry name (served under that name)")
    parser.add_argument("--tasks", type=int, default=24, help="chat edit tasks of realmodel_tasks (≤ 24)")
    parser.add_argument("--history", type=int, default=24, help="edits drawn from this repository's git history")
    parser.add_argument("--history-rev", default="HEAD", help="newest commit edits are drawn from")
    parser.add_argument("--history-min-bytes", type=int, default=300)
    parser.add_argument("--history-max-bytes", type=int, default=3000)
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--kv-cache-mib", type=int, default=1024,
                        help="KV cache of every engine (Cascade's two, vLLM's)")
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--ngram-ks", default="8,16,32,64", help="n-gram K to calibrate; the first is always measured")
    parser.add_argument("--ngram-max", type=int, default=4)
    parser.add_argument("--ngram-min", type=int, default=2)
    parser.add_argument("--suffix-python", help="an interpreter whose environment has arctic-inference and this "
                        "vLLM (adds vLLM's suffix method)")
    parser.add_argument("--peers", help="explicit peers in phase order, e.g. suffix:128,ngram:8 (ngram:K, "
                        "suffix:DEPTH); overrides --ngram-ks and --suffix-depths")
    parser.add_argument("--suffix-depths", default="24,128", help="suffix tree depths (K = min(depth, 64))")
    parser.add_argument("--calibrate-tasks", type=int, default=8, help="tasks of the calibration subset (0: none)")
    parser.add_argument("--full-peers", choices=["each", "best", "none"], default="each",
                        help="after calibration: n-gram K=8 and the best peer of each family / the best peer / "
                        "nothing (calibration only)")
    parser.add_argument("--cascade-once", action="store_true",
                        help="Cascade only in the first full phase (later phases: no prediction and the peer)")
    parser.add_argument("--per-task", action="store_true", help="also print per-task tables")
    parser.add_argument("--save-replies", help="write every reply (text, tokens, accepted, seconds) to this JSON file")
    parser.add_argument("--log-dir", default=f"/tmp/bench-http-predict-{int(time.time())}")
    parser.add_argument("--check-identical", action="store_true",
                        help="only the ≥ 10× check: default model, prediction = the greedy output")
    parser.add_argument("--check-tokens", type=int, default=200)
    parser.add_argument("--check-rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(run_check_identical(args) if args.check_identical else run_edits(args))


if __name__ == "__main__":
    main()
