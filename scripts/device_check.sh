#!/usr/bin/env bash
# The device check: everything the GPU path needs, in one go, with JSON results under $OUT.
#
#   bash scripts/device_check.sh          # on a GPU machine (one H200: fits in 8 minutes)
#   bash scripts/device_check.sh --cpu    # the same script end to end on CPU at tiny sizes (CI)
#
# $OUT (default: a new temporary folder, printed) receives:
#   device_check.json   random-weight checkpoints of real shapes made on the spot, the trainer
#                       (step, offload, reload, peak memory), weight sync s/GB, engine iteration
#                       samples + throughput-model fit error, sleep/wake and shift up/down times
#                       (pivotrl/bench/device_check.py says what each entry holds)
#   run_pivot/, run_colocated/   3-step `python train.py` runs (summary.json, metrics.jsonl, ...)
#   summary.json        pass/fail and seconds of each part
# Exit code: 0 when every part passed. Each part has its own time limit, so the whole script ends
# in bounded time even when a part hangs.
#
# GPU mode, as prepared (not yet run on a GPU): the four virtual devices of `cluster=local`
# share the one GPU (Ray is told not to hide it: RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1)
# and each vLLM engine takes 0.2 of its memory, so pivot can shift roles on one GPU. The local
# runtime trains on the CPU (its accelerator is `cpu`); fractional `num_gpus` per device actor
# with the trainer on CUDA needs a cluster setting the runtime does not have yet (see BENCHMARKS).
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

if [[ "$MODE" == gpu ]]; then
  CHECK_LIMIT=270; RUN_LIMIT=105   # 480 s in all: the 8 minutes on one H200
  export RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1
  RUN_ARGS=(engine=vllm engine.dtype=bfloat16
            engine.vllm_gpu_memory_utilization=0.2 engine.max_num_seqs=64)
else
  CHECK_LIMIT=150; RUN_LIMIT=150
  RUN_ARGS=()
fi
# 3 steps of real RL on the tiny models (bootstrap cached in ~/.cache/pivotrl after the first run).
RUN_ARGS+=(train.steps=3 train.warmup_steps=1 train.prompts_per_step=8 train.group_size=4
           data.val_size=16 logging.wandb_mode=disabled logging.progress=false)

declare -A RC SECS
part() {  # part NAME LIMIT_S CMD...: run CMD under a time limit, record its exit code and seconds
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  RC[$name]=$?
  SECS[$name]=$((SECONDS - t0))
  echo "device_check $name: exit ${RC[$name]} after ${SECS[$name]} s (log: $OUT/$name.log)"
}

part checks "$CHECK_LIMIT" python -m pivotrl.bench.device_check --mode "$MODE" --out "$OUT"
part run_pivot "$RUN_LIMIT" python train.py deploy=pivot "${RUN_ARGS[@]}" hydra.run.dir="$OUT/run_pivot"
part run_colocated "$RUN_LIMIT" python train.py deploy=colocated "${RUN_ARGS[@]}" hydra.run.dir="$OUT/run_colocated"

python - "$OUT" "$MODE" "${RC[checks]}" "${SECS[checks]}" "${RC[run_pivot]}" "${SECS[run_pivot]}" \
        "${RC[run_colocated]}" "${SECS[run_colocated]}" <<'PY'
import json, sys
from pathlib import Path
out, mode = Path(sys.argv[1]), sys.argv[2]
vals = sys.argv[3:]
parts = {}
for i, name in enumerate(("checks", "run_pivot", "run_colocated")):
    rc, secs = int(vals[2 * i]), int(vals[2 * i + 1])
    entry = {"exit_code": rc, "seconds": secs, "ok": rc == 0}
    if name.startswith("run_"):
        summ = out / name / "summary.json"
        entry["summary"] = json.loads(summ.read_text()) if summ.is_file() else None
        entry["ok"] = entry["ok"] and entry["summary"] is not None and entry["summary"].get("steps") == 3
    parts[name] = entry
res = {"mode": mode, "ok": all(p["ok"] for p in parts.values()), "parts": parts}
(out / "summary.json").write_text(json.dumps(res, indent=2, default=str))
print(f"device_check: {'PASSED' if res['ok'] else 'FAILED'}; {out / 'summary.json'}")
sys.exit(0 if res["ok"] else 1)
PY
