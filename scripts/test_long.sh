#!/usr/bin/env bash
# The long suite: the longest end-to-end tests (whole CLI runs one after another, jobs killed
# and resumed, a worker node removed, a Redis Cluster master killed, eight runs at once) and the
# one-minute fault soak, kept out of the default suite's ten minutes. Run it after
# scripts/test.sh (it needs the dev/pdf/video extras and redis-server that one installs).
#
#   bash scripts/test_long.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
echo "== pytest -m long"
python3 -m pytest -m long tests "$@"
echo "== the short fault soak (kills, lost replies, a Redis restart)"
python3 -m pytest -m slow "tests/integration/test_failover.py::test_fault_harness_short" "$@"
