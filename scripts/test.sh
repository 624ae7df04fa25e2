#!/usr/bin/env bash
# Install what the tests need and run lint, types and the default test suite.
# Fails (non-zero) when any step fails.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = "0" ]; then SUDO=""; else SUDO="sudo"; fi
if ! command -v redis-server >/dev/null 2>&1; then
  echo "== installing redis-server (apt-get)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi

echo "== installing rayorch and test dependencies (pip)"
python3 -m pip install -q --disable-pip-version-check -e ".[dev,pdf,video]"

echo "== PDF corpus (texlive-humanities-doc from Debian, cached under .cache/corpus)"
fetch_corpus() { python3 scripts/fetch_corpus.py --packages texlive-humanities-doc >/dev/null; }
if ! fetch_corpus 2>/dev/null; then
  # A fresh machine may have empty apt lists: update them once and retry.
  $SUDO apt-get update -qq >/dev/null 2>&1 || true
  fetch_corpus || echo "warning: corpus not fetched; tests/integration/test_pdf_pipeline.py will try again"
fi

export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-dev}"

echo "== ruff"
python3 -m ruff check rayorch tests bench scripts examples
echo "== mypy"
python3 -m mypy rayorch
echo "== pytest"
python3 -m pytest "$@"
