#!/usr/bin/env bash
# Install what the tests need and run lint, types and the default test suite.
# Fails (non-zero) when any step fails.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  echo "== installing redis-server (apt-get)"
  if [ "$(id -u)" = "0" ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi

echo "== installing rayorch and test dependencies (pip)"
python3 -m pip install -q --disable-pip-version-check -e ".[dev,pdf]"

export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-dev}"

echo "== ruff"
python3 -m ruff check rayorch tests bench scripts examples
echo "== mypy"
python3 -m mypy rayorch
echo "== pytest"
python3 -m pytest "$@"
