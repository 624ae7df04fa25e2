#!/usr/bin/env bash
# The object-store suite: rayorch's inputs, sinks and payloads on a real S3-API server on
# loopback (moto's server mode, from the dev extra) and on Azurite (Microsoft's Azure Storage
# emulator, npm; installed here when missing), with real Ray and redis-server. Installs the
# s3, azure and dev extras into the CURRENT python environment; run it after scripts/test.sh.
#
#   bash scripts/test_storage.sh [pytest args]
#
# $RAYORCH_TEST_S3=http://127.0.0.1:PORT uses an S3 server that is already running (CI
# starts one); otherwise the tests start their own moto_server on a free port.
set -euo pipefail
cd "$(dirname "$0")/.."

command -v redis-server >/dev/null 2>&1 || {
  echo "test_storage.sh: redis-server is missing: run bash scripts/test.sh first (it installs" \
       "it), or apt-get install redis-server" >&2
  exit 2
}

echo "== installing rayorch[s3,azure] (pip: obstore, boto3)"
python3 -m pip install -q --disable-pip-version-check -e ".[s3,azure,dev,pdf,video]"
if ! command -v azurite-blob >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  echo "== installing Azurite (npm)"
  npm install -g --silent azurite >/dev/null 2>&1 || true
fi
if ! command -v azurite-blob >/dev/null 2>&1; then
  # Loud: the az:// tests are the only ones that check conditional create on a second cloud.
  echo "######################################################################" >&2
  echo "## WARNING: Azurite is not installed (npm install -g azurite failed" >&2
  echo "## or npm is missing): the az:// tests of tests/storage/test_azure.py SKIP" >&2
  echo "######################################################################" >&2
fi

export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
echo "== pytest -m 's3 or azure' tests/storage"
python3 -m pytest -rs -m "s3 or azure" tests/storage "$@"
