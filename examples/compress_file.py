"""Lossless compression with the client library: stream a file into a container and back.

Both directions stream: each container chunk is written as the server sends it, and the upload
runs while the reply is read, so the file is never held in memory. ``--async`` does the same with
``AsyncCascadeClient``.

    python examples/compress_file.py some_file.py            # writes some_file.py.cz and checks it
"""

from __future__ import annotations

import asyncio
import filecmp
import sys
from pathlib import Path

from _common import parser
from cascade_client import AsyncCascadeClient, CascadeClient, CascadeError, CompressStats, DecompressStats


def sync_round_trip(server: str, key: str, source: Path, packed: Path,
                    restored: Path) -> tuple[CompressStats, DecompressStats]:
    with CascadeClient(server, key) as client:
        with source.open("rb") as src, packed.open("wb") as dst:
            stats = client.compress_to(dst, src, precision_bits=24)
        with packed.open("rb") as src, restored.open("wb") as dst:
            return stats, client.decompress_to(dst, src)


async def async_round_trip(server: str, key: str, source: Path, packed: Path,
                           restored: Path) -> tuple[CompressStats, DecompressStats]:
    async with AsyncCascadeClient(server, key) as client:
        with source.open("rb") as src, packed.open("wb") as dst:
            stats = await client.compress_to(dst, src, precision_bits=24)
        with packed.open("rb") as src, restored.open("wb") as dst:
            return stats, await client.decompress_to(dst, src)


def main() -> int:
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("file", type=Path)
    cli.add_argument("--async", dest="use_async", action="store_true", help="use AsyncCascadeClient")
    args = cli.parse_args()
    packed, restored = Path(f"{args.file}.cz"), Path(f"{args.file}.restored")
    try:
        if args.use_async:
            stats, result = asyncio.run(async_round_trip(args.server, args.api_key, args.file, packed, restored))
        else:
            stats, result = sync_round_trip(args.server, args.api_key, args.file, packed, restored)
    except CascadeError as exc:
        print(f"error: {exc.message} (status {exc.status}, code {exc.code})", file=sys.stderr)
        return 1
    same = filecmp.cmp(args.file, restored, shallow=False)
    restored.unlink()
    print(f"{args.file}: {stats.bytes_in} -> {stats.bytes_out} bytes, {stats.bits_per_byte:.3f} bits/byte, "
          f"{stats.tokens} tokens; restored {result.bytes} bytes in {result.segments} segments, identical={same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
