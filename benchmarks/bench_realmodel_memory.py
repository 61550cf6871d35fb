"""Start-up time and memory of a whole service on a real model, by process.

    python benchmarks/bench_realmodel_memory.py [--model smollm2-135m-instruct] [--flags "--no-enable-predictions"]

Starts ``cascade serve --model MODEL`` (both vLLM engines and the exact codec unless ``--flags`` switch
roles off), times it to ``/ready`` (engines loaded, codec self-test passed), then reads each process's
RSS and PSS (``/proc/PID/smaps_rollup``; PSS splits shared pages, so the PSS column adds up) after
start-up and again after one chat completion, one prediction request and one 1 KB compress.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "service"))
sys.path.insert(0, str(REPO))


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (children of any of its threads: engines start in threads)."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(x) for x in (task / "children").read_text().split()]
        except OSError:
            continue
    return [pid, *(d for kid in sorted(set(kids)) for d in descendants(kid))]


def memory(pid: int) -> dict[str, tuple[str, int, int]]:
    out = {}
    for p in descendants(pid):
        try:
            name = Path(f"/proc/{p}/comm").read_text().strip()
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines()[1:])
        except OSError:
            continue
        out[str(p)] = (name, int(fields["Rss"].split()[0]) << 10, int(fields["Pss"].split()[0]) << 10)
    return out


def table(snapshot: dict[str, tuple[str, int, int]]) -> list[str]:
    rows = [f"| {name} ({pid}) | {rss / 2**30:.2f} | {pss / 2**30:.2f} |" for pid, (name, rss, pss) in snapshot.items()]
    total = sum(pss for _, _, pss in snapshot.values())
    return [*rows, f"| **total** | | **{total / 2**30:.2f}** |"]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--flags", default="", help="extra cascade serve flags")
    args = parser.parse_args()

    from cascade.model_registry import resolve_model

    from tests.integration.conftest import start_service, stop_service

    model = resolve_model(args.model)
    scratch = Path(f"/tmp/bench-realmodel-memory-{int(time.time())}")
    scratch.mkdir(parents=True)
    start = time.perf_counter()
    service = start_service(scratch, ["--model", model, *shlex.split(args.flags)], timeout=900)
    ready_s = time.perf_counter() - start
    try:
        at_ready = memory(service.process.pid)
        name = Path(model).name
        with httpx.Client(base_url=service.base_url, headers=service.headers, timeout=900) as client:
            ask = "Write a Python function that adds two numbers."
            chat = {"model": name, "messages": [{"role": "user", "content": ask}], "max_tokens": 64, "temperature": 0}
            client.post("/v1/chat/completions", json=chat).raise_for_status()
            prediction = {"type": "content", "content": "def add(a, b):\n"}
            client.post("/v1/chat/completions", json={**chat, "prediction": prediction})
            client.post("/compress", content=(REPO / "README.md").read_bytes()[:1024],
                        headers={"content-type": "text/plain"})
        after = memory(service.process.pid)
    finally:
        stop_service(service)
    print(f"model {model}, flags {args.flags or '(defaults)'}: ready after {ready_s:.0f} s")
    for label, snapshot in (("at /ready", at_ready), ("after chat, prediction and a 1 KB compress", after)):
        print(f"\n{label}\n\n| process | RSS GiB | PSS GiB |\n|---|---|---|")
        print("\n".join(table(snapshot)))


if __name__ == "__main__":
    main()
