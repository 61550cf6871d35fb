#!/bin/sh
# A base image for deploy/Dockerfile.cpu built from Debian's packages, for machines whose Docker
# engine cannot pull the official python:3.11-slim (no registry access) but can reach a Debian
# mirror: debootstrap a minimal bookworm root with Python 3.11 (Debian's python3), its venv module
# and libnuma (vLLM's CPU kernels link it), then `docker import` it.
#
#   sh deploy/offline-base.sh [TAG]        (root; needs debootstrap and a running Docker engine)
#   docker build -f deploy/Dockerfile.cpu --build-arg BASE_IMAGE=TAG -t cascade-cpu:0.1.0 .
#
# TAG defaults to cascade-base:bookworm; DEBIAN_MIRROR picks the mirror (default deb.debian.org).
# Takes about a minute here. The image has no pip of its own: the Dockerfile installs into a venv.
set -eu
tag="${1:-cascade-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
for tool in debootstrap docker; do
    command -v "$tool" >/dev/null || { echo "offline-base: $tool is not installed" >&2; exit 1; }
done
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT INT TERM
debootstrap --variant=minbase --include=python3,python3-venv,passwd,ca-certificates,libnuma1 \
    bookworm "$root" "$mirror" >&2
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
tar -C "$root" --numeric-owner -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    --message "debootstrap --variant=minbase bookworm ($mirror) + python3 python3-venv libnuma1" \
    - "$tag"
echo "offline-base: built $tag" >&2
