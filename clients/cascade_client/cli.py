"""Client side of the ``cascade`` command."""

from __future__ import annotations

import argparse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cascade", description="Cascade gateway and client")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the gateway (see `cascade serve --help`)")
    sub.add_parser("config-table", help="print the configuration table")
    return parser


def main(argv: list[str]) -> int:
    build_parser().parse_args(argv)
    return 0
