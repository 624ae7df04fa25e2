#!/usr/bin/env bash
# The layout suite: `rayorch run pdf --ocr layout` end to end on the CPU, with the layout,
# OCR and table-structure models that ship inside their wheels (nothing is downloaded).
# Installs the layout, dev, pdf and video extras.
#
#   bash scripts/test_layout.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== installing rayorch[layout,dev,pdf,video]"
python3 -m pip install -q --disable-pip-version-check -e ".[layout,dev,pdf,video]"
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
echo "== pytest -m layout tests"
python3 -m pytest -m layout tests "$@"
