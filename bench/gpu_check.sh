#!/usr/bin/env bash
# The GPU check: on a machine with a GPU (and the package registries), in under 10 minutes:
# install vLLM's GPU build into a fresh virtualenv, build the test models, run tests/model on
# the GPU, a short engine benchmark and MinerU2.5's two steps (--ocr mineru beside
# mineru-vl-utils' stepping and concurrent modes, bench/mineru_orchestration.py), then print
# ONE summary line:
#
#   gpu_check: OK gpus=1 vllm=0.32.0 tests=8/8 engine=… pages/s build=… s mineru=E2E …/…/… s total=… s
#   gpu_check: FAILED at STEP (rc=N) … total=… s          (and the step's log tail above it)
#
#   bash bench/gpu_check.sh            # from anywhere; logs and JSON under bench/out/gpu_check/
#
# GPU_CHECK_BUDGET_S (560) is the whole run's deadline; each step gets at most its own cap
# and never past the deadline. GPU_CHECK_VENV (.venv-gpu) is the virtualenv (made anew).
# GPU_CHECK_DRY_CPU=1 rehearses the script without a GPU: no install, this python3 (with
# the model extra installed), vLLM's CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."

START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-560}
OUT=bench/out/gpu_check
VENV=${GPU_CHECK_VENV:-.venv-gpu}
VLLM_VERSION=0.32.0
mkdir -p "$OUT"
STEP=setup

elapsed() { echo $(( $(date +%s) - START )); }
summary_fail() {
  local rc=$1
  if [ -f "$OUT/$STEP.log" ]; then tail -n 40 "$OUT/$STEP.log" >&2 || true; fi
  echo "gpu_check: FAILED at $STEP (rc=$rc) total=$(elapsed)s logs=$OUT/"
  exit 1
}
trap 'summary_fail $?' ERR

# run STEP CAP_S CMD...: CMD under `timeout`, its output in $OUT/STEP.log.
run() {
  STEP=$1; local cap=$2; shift 2
  local left=$(( BUDGET - $(elapsed) ))
  if [ "$left" -le 5 ]; then echo "no time left for $STEP" > "$OUT/$STEP.log"; return 124; fi
  [ "$cap" -lt "$left" ] || cap=$left
  echo "== $STEP (at most ${cap}s; $(elapsed)s so far)" >&2
  timeout --kill-after=20 "$cap" "$@" > "$OUT/$STEP.log" 2>&1
}

DRY=${GPU_CHECK_DRY_CPU:-0}
GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "$DRY" = 1 ]; then GPUS=0
elif [ "${GPUS:-0}" -lt 1 ]; then
  STEP=gpu; echo "nvidia-smi lists no GPU" > "$OUT/gpu.log"; summary_fail 1
fi

if ! command -v redis-server >/dev/null 2>&1; then
  run redis 120 bash -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server'
fi

if [ "$DRY" = 1 ]; then
  PY=$(command -v python3)
  run import 60 "$PY" -c "import vllm; print(vllm.__version__)"
else
  run venv 60 python3 -m venv --clear "$VENV"
  PY="$PWD/$VENV/bin/python"
  run install 270 "$PY" -m pip install -q --disable-pip-version-check \
    "vllm==$VLLM_VERSION" -e ".[gpu,dev,pdf,video]"
  run import 60 "$PY" -c "import torch, vllm; assert torch.cuda.is_available(), 'CUDA not usable'; print(vllm.__version__, torch.cuda.get_device_name(0))"
fi

export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
[ "$DRY" = 1 ] || export RAYORCH_TEST_RAY_GPUS="$GPUS"
export RAYORCH_TEST_MODELS="$PWD/.cache/test-models"
run models 60 "$PY" -m rayorch.testmodels "$RAYORCH_TEST_MODELS"

# The tests' failures are reported, not fatal here: the benchmark still runs.
TESTS_RC=0
run tests 200 "$PY" -m pytest -m model tests/model -q -p no:cacheprovider -o addopts="" \
  --timeout=180 || TESTS_RC=$?
# counts from pytest's last line; grep finds none when pytest was stopped (|| true: set -e)
PASSED=$({ grep -Eo '[0-9]+ passed' "$OUT/tests.log" || true; } | tail -1 | grep -Eo '[0-9]+' || true)
FAILED=$({ grep -Eo '[0-9]+ (failed|error)' "$OUT/tests.log" || true; } | awk '{s+=$1} END {print s+0}')
PASSED=${PASSED:-0}

run bench 120 "$PY" -m bench.vllm_engine --pages 64 --batch-size 16 --skip-job \
  --json "$OUT/engine.json"
ENGINE=$("$PY" -c "import json; r = json.load(open('$OUT/engine.json')); print(r['engine_pages_per_s'], r['engine_build_s'])")

# MinerU2.5's two steps on the GPU: one engine per mode, 8 documents, one run each; reported,
# not fatal (the tests' verdict is the check's).
MINERU="failed"
MINERU_MODEL=$("$PY" -c "from rayorch.testmodels import build; print(build('mineru', '$RAYORCH_TEST_MODELS'))")
if run mineru 90 "$PY" -m bench.mineru_orchestration --model "$MINERU_MODEL" --docs 8 \
    --repeat 1 --json "$OUT/mineru.json"; then
  MINERU=$("$PY" -c "import json; rows = json.load(open('$OUT/mineru.json'))['medians']; print('/'.join(f\"{r['e2e_s']:.1f}\" for r in rows))")
fi
trap - ERR

STATUS=OK
[ "$TESTS_RC" -eq 0 ] || STATUS=FAILED
echo "gpu_check: $STATUS gpus=$GPUS vllm=$VLLM_VERSION tests=$PASSED/$((PASSED + FAILED)) (rc=$TESTS_RC) engine=${ENGINE% *} pages/s build=${ENGINE#* } s mineru=E2E $MINERU s (rayorch/stepping/concurrent) total=$(elapsed)s logs=$OUT/"
[ "$STATUS" = OK ]
