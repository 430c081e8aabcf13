#!/usr/bin/env bash
# Create .venv and install Quarry with every backend and the dev tools. Idempotent.
#   PYTHON=python3.11 bash scripts/setup.sh
# torch is installed first and pinned to the CPU build 2.13.0 (QUARRY_TORCH_SPEC overrides it,
# e.g. "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" on a machine whose pip
# would otherwise pull a multi-GB CUDA build).
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
python -m pip install -q -e ".[all,dev]"
python - <<'PY'
import numpy, torch, pymilvus, bm25s
print(f"setup ok: numpy {numpy.__version__}, torch {torch.__version__}, pymilvus {pymilvus.__version__}, bm25s {bm25s.__version__}")
PY
