#!/usr/bin/env bash
# The suite's timing-sensitive tests beside a CPU hog: `stress-ng --cpu 4` on the machine's cores,
# RUNS times in a row (issue 26: deadlines, breakers, settles and budgets must not flake on a loaded
# CI machine). Runs in this process (no workers), with the services scripts/test.sh starts.
#   bash scripts/timing_under_load.sh        # 5 runs
#   RUNS=1 bash scripts/timing_under_load.sh tests/core/test_heap.py
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
command -v stress-ng >/dev/null || { echo "stress-ng not found (Debian: apt-get install stress-ng)" >&2; exit 2; }
# shellcheck disable=SC1091
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
eval "$(bash scripts/services.sh env)"
TESTS=("$@")
if [ ${#TESTS[@]} -eq 0 ]; then
  TESTS=(
    tests/core/test_heap.py tests/core/test_store_outage.py tests/eval/test_report.py  # injectable clocks
    tests/rerank/test_budget.py tests/rerank/test_end_to_end.py tests/stores/test_qdrant.py
    tests/generation/test_answer_stub.py tests/core/test_query_hardening.py  # deadlines, stalls
    tests/core/test_access.py tests/core/test_token_quota.py  # rate windows, shedding, Retry-After
  )
fi
stress-ng --cpu 4 --quiet &
HOG=$!
trap 'kill $HOG 2>/dev/null || true' EXIT
for run in $(seq 1 "${RUNS:-5}"); do
  start=$(date +%s)
  python -m pytest -p no:cacheprovider -q -n 0 "${TESTS[@]}" | tail -1
  echo "run $run of ${RUNS:-5}: passed in $(( $(date +%s) - start )) s beside stress-ng --cpu 4"
done
