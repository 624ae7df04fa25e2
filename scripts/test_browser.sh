#!/usr/bin/env bash
# The browser suite: the web view (rayorch ui) in a real headless Chromium, driven by
# Playwright pointed at Debian's chromium (Playwright downloads no browser). Installs
# chromium with apt-get when it is missing, and the ui and dev extras.
#
#   bash scripts/test_browser.sh [pytest args]
#
# RAYORCH_UI_SCREENSHOTS=docs also writes the screenshots of the three main pages there
# (docs/ui-runs.png, docs/ui-run.png, docs/ui-source.png).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" = "0" ]; then SUDO=""; else SUDO="sudo"; fi
if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
  echo "== installing chromium (apt-get)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
python3 -c "import starlette, uvicorn, jinja2, playwright" 2>/dev/null || {
  echo "== installing rayorch[ui,dev]"
  python3 -m pip install -q --disable-pip-version-check -e ".[ui,dev]"
}
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
echo "== pytest -m browser tests/browser"
python3 -m pytest -m browser tests/browser "$@"
