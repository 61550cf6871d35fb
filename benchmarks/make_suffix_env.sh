#!/usr/bin/env bash
# A throwaway venv in which vLLM's `suffix` speculative method runs: Arctic Inference built from its
# source distribution against this project's venv (torch 2.13.0+cpu, vLLM 0.32), which it sees through
# a .pth file and never modifies. Only the C++ suffix tree (nanobind) is compiled; Arctic's vLLM
# plugin stays off (it needs ARCTIC_INFERENCE_ENABLED=1 and CUDA).
#   benchmarks/make_suffix_env.sh [VENV=/work/main/.venv] [OUT=/tmp/arctic]
#   then: python benchmarks/bench_http_predict.py --suffix-python OUT/run/bin/python
set -euo pipefail
VENV=${1:-/work/main/.venv}
OUT=${2:-/tmp/arctic}
VERSION=0.3.0
PYTHON=$(readlink -f "$VENV/bin/python")
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$OUT"
for env in build run; do
  "$PYTHON" -m venv "$OUT/$env"
  echo "$SITE" > "$("$OUT/$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_project.pth"
done
"$OUT/build/bin/pip" install -q setuptools wheel ninja nanobind==2.9.2 grpcio-tools "cmake>=3.18"
"$OUT/build/bin/pip" download -q --no-deps --no-build-isolation --no-binary :all: -d "$OUT/src" "arctic-inference==$VERSION"
tar xzf "$OUT/src/arctic_inference-$VERSION.tar.gz" -C "$OUT/src"
(cd "$OUT/src/arctic_inference-$VERSION" &&
  CMAKE_ARGS="-DPython_EXECUTABLE=$OUT/build/bin/python" \
  "$OUT/build/bin/pip" wheel -q --no-deps --no-build-isolation -w "$OUT/wheel" .)
"$OUT/run/bin/pip" install -q --no-deps "$OUT"/wheel/arctic_inference-"$VERSION"-*.whl
"$OUT/run/bin/python" -c 'from arctic_inference.suffix_decoding import SuffixDecodingCache; print("suffix decoding ready:", SuffixDecodingCache)'
