#!/usr/bin/env bash
# Set up, start the services, lint, type-check and run the whole test suite (every marker:
# integration, slow; gpu tests run only where CUDA is present). Extra args go to pytest.
#   bash scripts/test.sh              # everything
#   bash scripts/test.sh -m "not slow" tests/core
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
# shellcheck disable=SC1091
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
bash scripts/services.sh start
trap 'bash scripts/services.sh stop' EXIT
eval "$(bash scripts/services.sh env)"
echo "== ruff"; ruff check .
echo "== mypy"; mypy
echo "== pytest"
python -m pytest -p no:cacheprovider "$@"
