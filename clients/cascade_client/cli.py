"""Client side of the ``cascade`` command: compress, decompress, kcbs (``-`` is stdin/stdout)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from typing import IO

from cascade_client.client import CascadeClient, CascadeError


@contextlib.contextmanager
def _open(path: str, mode: str) -> Iterator[IO[bytes]]:
    if path == "-":
        yield sys.stdin.buffer if "r" in mode else sys.stdout.buffer
        return
    with open(path, mode) as handle:
        yield handle


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cascade", description="Cascade gateway and client")
    parser.add_argument("--server", help="server URL (env CASCADE_SERVER, default http://127.0.0.1:8000)")
    parser.add_argument("--api-key", help="API key (env CASCADE_API_KEY)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the gateway (see `cascade serve --help`)")
    sub.add_parser("config-table", help="print the configuration table")
    comp = sub.add_parser("compress", help="compress FILE into a .cz container")
    comp.add_argument("input")
    comp.add_argument("-o", "--output", required=True)
    comp.add_argument("--top-k", type=int)
    comp.add_argument("--precision-bits", type=int, choices=(16, 24, 32))
    comp.add_argument("--verify", action="store_true")
    dec = sub.add_parser("decompress", help="decompress a .cz container")
    dec.add_argument("input")
    dec.add_argument("-o", "--output", required=True)
    beam = sub.add_parser("kcbs", help="top-k-constrained beam search")
    beam.add_argument("prompt")
    beam.add_argument("-k", "--beam-width", type=int, default=4)
    beam.add_argument("-T", "--steps", type=int, default=16)
    beam.add_argument("--target")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        with CascadeClient(args.server, args.api_key) as client:
            if args.command == "compress":
                with _open(args.input, "rb") as src, _open(args.output, "wb") as dst:
                    stats = client.compress_to(dst, src, top_k=args.top_k, precision_bits=args.precision_bits,
                                               verify=args.verify or None)
                print(f"{stats.bytes_in} → {stats.bytes_out} bytes ({stats.bits_per_byte:.3f} bits/byte, "
                      f"{stats.tokens} tokens, {stats.seconds:.1f} s)", file=sys.stderr)
            elif args.command == "decompress":
                with _open(args.input, "rb") as src, _open(args.output, "wb") as dst:
                    client.decompress_to(dst, src)
            elif args.command == "kcbs":
                print(json.dumps(client.kcbs(args.prompt, args.beam_width, args.steps, target=args.target), indent=1))
    except CascadeError as exc:
        print(f"cascade: error: {exc.message}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"cascade: error: {exc}", file=sys.stderr)
        return 1
    return 0
