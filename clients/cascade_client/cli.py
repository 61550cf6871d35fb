"""Client side of the ``cascade`` command: ``compress``, ``decompress``, ``kcbs``, ``export-topk``.

``-`` is stdin/stdout. Progress bars (bytes uploaded, bytes of reply received) go to stderr when it
is a terminal, unless ``--quiet``. Any failure is one ``cascade: error: ...`` line on stderr and a
non-zero exit (1 for errors, 2 for bad usage, 130 when interrupted); an output file is only put in
place once the whole reply has arrived, so a failure never leaves a truncated file behind.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any

import httpx
from tqdm import tqdm

from cascade_client.client import CascadeClient
from cascade_client.protocol import CascadeError, CompressStats
from cascade_client.retry import RetryPolicy
from cascade_client.spread import DEFAULT_PIECE_BYTES
from cascade_client.topk_export import ExportStats, iter_sources

EXIT_ERROR, EXIT_INTERRUPTED, EXIT_TERMINATED = 1, 130, 143  # bad usage exits with 2 from argparse


class _Terminated(BaseException):
    """SIGTERM, raised where the main thread is, so a half-written output file is removed as on Ctrl-C."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


class Bars:
    """Two tqdm bars: bytes uploaded (with a total when the input size is known) and bytes (and
    chunks) received."""

    def __init__(self, upload_total: int | None, received_unit: str) -> None:
        common: dict[str, Any] = {"unit": "B", "unit_scale": True, "unit_divisor": 1024, "file": sys.stderr,
                                  "dynamic_ncols": True, "leave": False}
        self._sent = tqdm(total=upload_total, desc="upload", position=0, **common)
        self._received = tqdm(desc=received_unit, position=1, **common)
        self._chunks = 0

    def sent(self, nbytes: int) -> None:
        self._sent.update(nbytes)

    def received(self, nbytes: int) -> None:
        self._chunks += 1
        self._received.set_postfix(chunks=self._chunks, refresh=False)
        self._received.update(nbytes)

    def close(self) -> None:
        self._received.close()
        self._sent.close()


def _size(handle: IO[bytes]) -> int | None:
    """Bytes left to read in a regular file (``None`` for pipes and terminals)."""
    try:
        status = os.fstat(handle.fileno())
        return max(status.st_size - handle.tell(), 0) if status.st_mode & 0o170000 == 0o100000 else None
    except (OSError, ValueError, AttributeError):
        return None


@contextlib.contextmanager
def _input(path: str) -> Iterator[IO[bytes]]:
    if path == "-":
        # Unbuffered fd 0, not sys.stdin.buffer: the reader thread may still be blocked in a read
        # when we exit after an error, and a buffered stdin's lock would then abort the interpreter.
        with open(sys.stdin.fileno(), "rb", buffering=0, closefd=False) as raw:
            yield raw
        return
    with open(path, "rb") as handle:
        yield handle


@contextlib.contextmanager
def _output(path: str) -> Iterator[IO[bytes]]:
    """stdout; ``path`` itself when it is not a regular file (a device such as ``/dev/null``, a FIFO,
    ``/dev/fd/N`` of a process substitution: replacing those would destroy them); else a temporary file
    beside the file ``path`` names (through a symlink, which stays) that replaces it only on success,
    with the replaced file's permissions."""
    if path == "-":
        yield sys.stdout.buffer
        sys.stdout.buffer.flush()
        return
    try:
        existing: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        existing = None
    if existing is not None and stat.S_ISDIR(existing.st_mode):
        raise IsADirectoryError(errno.EISDIR, "Is a directory", path)
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        with open(path, "wb") as handle:
            yield handle
        return
    target = os.path.realpath(path)
    partial = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.{os.getpid()}.part")
    try:
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    except OSError as exc:
        raise type(exc)(exc.errno, exc.strerror, path) from None
    try:
        with open(descriptor, "wb") as handle:
            yield handle
            if existing is not None:
                os.chmod(handle.fileno(), stat.S_IMODE(existing.st_mode))
        os.replace(partial, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise


def _default_output(path: str, command: str, force: bool = False) -> str:
    """INPUT.cz, or INPUT without .cz. A name the user did not type never replaces a file that is
    already there (as gzip and zstd refuse without ``-f``): ``-f`` or ``-o`` says so explicitly."""
    if path == "-":
        return "-"
    if command == "compress":
        output = path + ".cz"
    elif path.endswith(".cz"):
        output = path[:-3]
    else:
        raise CascadeError(0, f"cannot derive an output name from {path!r} (no .cz suffix): give -o")
    if not force and os.path.lexists(output):
        raise CascadeError(0, f"{output} already exists: give -f to replace it, or -o to write elsewhere")
    return output


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of seconds above 0 is required")
    return value


def _at_least_zero(convert: Callable[[str], float]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = convert(text)
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(f"{text!r}: a number of at least 0 is required")
        return value
    return parse


def _server_url(text: str) -> str:
    if "://" not in text:
        raise argparse.ArgumentTypeError(f"{text!r} has no scheme: give it as http://{text} (or https://)")
    if not text.lower().startswith(("http://", "https://")):
        raise argparse.ArgumentTypeError(f"{text!r}: the server is spoken to over http:// or https://")
    return text


def _common(parser: argparse.ArgumentParser, defaults: bool) -> None:
    """Connection and display options, accepted before the command and after it."""
    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument("--server", type=_server_url, default=default(os.environ.get("CASCADE_SERVER")),
                        help="server URL (env CASCADE_SERVER, default http://127.0.0.1:8000)")
    parser.add_argument("--api-key", default=default(os.environ.get("CASCADE_API_KEY")),
                        help="Bearer API key (env CASCADE_API_KEY)")
    parser.add_argument("--timeout", type=_positive_seconds, default=default(3600.0),
                        help="seconds to wait for each reply chunk")
    parser.add_argument("--retries", type=_at_least_zero(int), default=default(4),
                        help="times a request is sent again after a 429/502/503 answer or a connection that failed "
                             "before any byte of the answer (default 4; 0: never)")
    parser.add_argument("--retry-budget", type=_at_least_zero(float), default=default(60.0),
                        help="seconds all attempts of one request may take, waits included (default 60)")
    parser.add_argument("-q", "--quiet", action="store_true", default=default(False),
                        help="no progress bars and no statistics line")
    parser.add_argument("--progress", action="store_true", default=default(False),
                        help="progress bars even when stderr is not a terminal")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cascade", description="Cascade gateway and client")
    _common(parser, defaults=True)
    common = argparse.ArgumentParser(add_help=False)
    _common(common, defaults=False)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the gateway (see `cascade serve --help`)")
    sub.add_parser("config-table", help="print the configuration table (--limits: the limits table)")
    sub.add_parser("models", help="list and fetch real models by name (see `cascade models --help`)")
    comp = sub.add_parser("compress", parents=[common], help="compress INPUT into a .cz container")
    comp.add_argument("input", help="file, or - for stdin")
    comp.add_argument("-o", "--output", help="file, or - for stdout (default: INPUT.cz; stdout for stdin)")
    comp.add_argument("--top-k", type=int)
    comp.add_argument("--precision-bits", type=int, choices=(16, 24, 32))
    comp.add_argument("--lane-tokens", "--segment-tokens", dest="lane_tokens", type=int,
                      help="tokens per lane, one context window each (default: the server's)")
    comp.add_argument("--lanes", type=int, help="lanes per segment, decoded in parallel (1-64)")
    comp.add_argument("--context", help="text the model conditions on (the decoder reads it from the container)")
    comp.add_argument("--verify", action="store_true", help="the server decodes every segment before answering")
    dec = sub.add_parser("decompress", parents=[common], help="decompress a .cz container")
    dec.add_argument("input", help="file, or - for stdin")
    dec.add_argument("-o", "--output", help="file, or - for stdout (default: INPUT without .cz; stdout for stdin)")
    for codec in (comp, dec):
        codec.add_argument("-f", "--force", action="store_true",
                           help="replace the default output file (INPUT.cz, or INPUT without .cz) if it exists")
        codec.add_argument("--concurrency", type=int,
                           help="spread the input over the replicas behind a balancer: cut it into pieces and "
                                "send this many at once (one container out; default: one stream)")
        codec.add_argument("--piece-bytes", type=int,
                           help=f"bytes of text per piece with --concurrency (default {DEFAULT_PIECE_BYTES}; the "
                                "container depends on it, not on the concurrency)")
    beam = sub.add_parser("kcbs", parents=[common], help="top-k-constrained beam search (prints the JSON result)")
    beam.add_argument("prompt")
    beam.add_argument("-k", "--beam-width", type=int, default=4)
    beam.add_argument("-T", "--steps", type=int, default=16)
    beam.add_argument("--target", help="text whose (near-)verbatim probability to bound")
    beam.add_argument("--max-edit-distance", type=int)
    beam.add_argument("--temperature", type=float)
    beam.add_argument("--eos", choices=("block", "stop"))
    beam.add_argument("--all-candidates", action="store_true", help="final_prune=false: return all k² candidates")
    export = sub.add_parser("export-topk", parents=[common],
                            help="teacher-forced top-k distributions of every position of a corpus, as binary")
    export.add_argument("inputs", nargs="+", metavar="FILE|DIR", help="UTF-8 text files; directories recursively")
    export.add_argument("-o", "--output", required=True, help="binary output file, or - for stdout")
    export.add_argument("--compression-top-k", type=int, default=100,
                        help="the export's K: candidates kept per position (default 100)")
    export.add_argument("--window", type=int, help="tokens per request (default: the model's length - 1)")
    export.add_argument("--overlap", type=int, default=64, help="context tokens repeated from the previous window")
    export.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    export.add_argument("--temperature", type=float)
    export.add_argument("--top-p", type=float)
    export.add_argument("--top-k", type=int, help="the sampling stack's top-k (as on the HTTP API)")
    export.add_argument("--min-p", type=float)
    return parser


def _show_progress(args: argparse.Namespace) -> bool:
    return not args.quiet and (args.progress or sys.stderr.isatty())


def _codec(client: CascadeClient, args: argparse.Namespace) -> CompressStats | None:
    output = args.output or _default_output(args.input, args.command, args.force)
    with _input(args.input) as src, _output(output) as dst:
        bars = Bars(_size(src), "container" if args.command == "compress" else "text") \
            if _show_progress(args) else None
        try:
            spread = {"concurrency": args.concurrency, "piece_bytes": args.piece_bytes or DEFAULT_PIECE_BYTES}
            if args.command == "compress":
                return client.compress_to(dst, src, progress=bars, top_k=args.top_k,
                                          precision_bits=args.precision_bits, lane_tokens=args.lane_tokens,
                                          lanes=args.lanes, context=args.context, verify=args.verify or None,
                                          **spread)
            client.decompress_to(dst, src, progress=bars, **spread)
            return None
        finally:
            if bars is not None:
                bars.close()


def _export(client: CascadeClient, args: argparse.Namespace) -> ExportStats:
    sources = list(iter_sources(args.inputs))
    for path in sources:
        if not path.is_file():
            raise CascadeError(0, f"no such file: {path}")
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k,
                "min_p": args.min_p}
    with _output(args.output) as dst:
        bars = Bars(sum(p.stat().st_size for p in sources), "export") if _show_progress(args) else None
        try:
            return client.export_topk_to(dst, sources, args.compression_top_k, progress=bars, window=args.window,
                                         overlap=args.overlap, concurrency=args.concurrency,
                                         sampling={k: v for k, v in sampling.items() if v is not None})
        except ValueError as exc:
            raise CascadeError(0, str(exc)) from None
        finally:
            if bars is not None:
                bars.close()


def _run(args: argparse.Namespace) -> None:
    retry = RetryPolicy(attempts=args.retries + 1, budget_seconds=args.retry_budget)
    with CascadeClient(args.server, args.api_key, timeout=args.timeout, retry=retry) as client:
        if args.command in ("compress", "decompress"):
            stats = _codec(client, args)
            if stats is not None and not args.quiet:
                print(f"{stats.bytes_in} → {stats.bytes_out} bytes ({stats.bits_per_byte:.3f} bits/byte, "
                      f"{stats.tokens} tokens, {stats.seconds:.1f} s)", file=sys.stderr)
        elif args.command == "kcbs":
            result = client.kcbs(args.prompt, args.beam_width, args.steps, target=args.target,
                                 max_edit_distance=args.max_edit_distance, temperature=args.temperature,
                                 eos=args.eos, final_prune=False if args.all_candidates else None)
            print(json.dumps(result.raw, indent=1))
        elif args.command == "export-topk":
            exported = _export(client, args)
            if not args.quiet:
                print(f"{exported.files} files, {exported.tokens} tokens → {exported.positions} positions "
                      f"({exported.requests} requests, {exported.output_bytes} bytes)", file=sys.stderr)


def silence_stdout() -> None:
    """After a BrokenPipeError: the reader of stdout went away (e.g. ``| head``), so say nothing more
    on the closed pipe (and stop Python's error when it flushes stdout at exit)."""
    with contextlib.suppress(OSError):
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "piece_bytes", None) is not None and getattr(args, "concurrency", None) is None:
        parser.error("--piece-bytes cuts the input for --concurrency: give --concurrency too")
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    try:
        _run(args)
    except CascadeError as exc:
        _fail(exc.message + (f" [{exc.code}]" if exc.code else "") + (f" (HTTP {exc.status})" if exc.status else ""))
        return EXIT_ERROR
    except KeyboardInterrupt:
        _fail("interrupted")
        return EXIT_INTERRUPTED
    except _Terminated:
        _fail("terminated")
        return EXIT_TERMINATED
    except BrokenPipeError:
        silence_stdout()
        return EXIT_ERROR
    except OSError as exc:
        _fail(f"{exc.strerror or exc}: {exc.filename}" if exc.filename else str(exc))
        return EXIT_ERROR
    except (ValueError, LookupError, httpx.InvalidURL) as exc:
        # a reply that is not what the protocol says (not JSON, a missing field, bad base64), or an
        # argument the request cannot carry (a URL, key or text that cannot be encoded): one line, no traceback
        _fail(f"{exc} ({type(exc).__name__})")
        return EXIT_ERROR
    return 0


def _fail(message: str) -> None:
    print(f"cascade: error: {' '.join(message.split())}", file=sys.stderr)
