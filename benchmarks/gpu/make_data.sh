#!/bin/bash
# Builds the held-out texts the GPU run reads (.gpu/data/{code,prose}.txt.xz, 1 MiB each) and prints
# the gzip -9 / xz -9e / zstd -19 --long baselines on the same bytes (on this, the CPU machine).
#   code : the stdlib packages json/, email/, http/, asyncio/ of CPython 3.11 (held out per the model
#          card), files in sorted order, as benchmarks/bench_codec.py takes them
#   prose: man pages of sections 7, 5, 2 (the model trained only on man1/man8), OpenSSL *ssl pages and
#          pages over 60 KB rendered skipped, rendered with groff -Tutf8, documents joined by </s>
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${WORK:-/tmp/cascade_gpu_data}; mkdir -p "$W" .gpu/data
out=$W/prose_all.txt; : > "$out"
for sec in 7 5 2; do
  for f in $(ls /usr/share/man/man$sec/*.gz | grep -v "ssl.gz$" | sort); do
    [ -L "$f" ] && continue
    zcat "$f" | head -c 200 | grep -q '^\.so ' && continue
    txt=$(zcat "$f" | GROFF_NO_SGR=1 groff -t -man -Tutf8 -rLL=100n -rHY=0 -dAD=l 2>/dev/null | col -bx | sed 's/^       //')
    [ -n "$txt" ] || continue; [ ${#txt} -gt 60000 ] && continue
    printf '%s\n</s>' "$txt" >> "$out"
    [ "$(stat -c %s "$out")" -gt 1150000 ] && break 2
  done
done
python3 - "$W" <<'PY'
import lzma, pathlib, sys, sysconfig
w = pathlib.Path(sys.argv[1]); root = pathlib.Path(sysconfig.get_paths()["stdlib"])
code = b"".join(p.read_bytes() for pkg in ("json", "email", "http", "asyncio") for p in sorted((root / pkg).rglob("*.py")))
n = 1 << 20
for name, data in (("code", code), ("prose", (w / "prose_all.txt").read_bytes())):
    d = data[:n].decode("utf-8", "ignore").encode()
    (w / f"{name}.txt").write_bytes(d)
    pathlib.Path(f".gpu/data/{name}.txt.xz").write_bytes(lzma.compress(d, preset=9))
PY
for f in code prose; do
  for n in 1048576 131072; do
    head -c $n "$W/$f.txt" > "$W/$f.$n"
    g=$(gzip -9 -c "$W/$f.$n" | wc -c); x=$(xz -9e -c "$W/$f.$n" | wc -c); z=$(zstd -19 --long -c -q "$W/$f.$n" | wc -c)
    echo "$f $n bytes: gzip -9 $g, xz -9e $x, zstd -19 --long $z"
  done
done
