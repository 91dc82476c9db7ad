#!/usr/bin/env bash
# The accelerator check: profile grid of the default shape (the torch executor), a short
# wall-clock replay, the fidelity figures, and the measured profile checked against the roofline
# one, all written to OUTDIR. Every step has a time limit; together they stay under 10 minutes on
# one H200 (60 + 200 + 90 + 200 + 30 s at most).
#
# The accelerator machine has no package registry and takes at most 64 MiB of carried files a
# call, so vLLM cannot be installed there: this script checks the torch executor and the
# simulator calibrated from it, from the source tree (PYTHONPATH), on the image's own Python and
# CUDA torch. The vLLM adapter's GPU use (the `vllm` extra) is documented in docs/vllm.md and
# untested on a GPU. This script has not been run on a GPU by the session that last changed it.
#
#   bash scripts/gpu_check.sh OUTDIR
#
# DEVICE, SHAPE, BUDGET_GIB, PYTHON override the defaults (cuda, llama2-7b, 40, python), and for
# the tiny shape CAL, DUR, REPLAY the calibration, fidelity and replay seconds; the
# CPU dry run the tests do is  DEVICE=cpu SHAPE=tiny BUDGET_GIB=0.25 bash scripts/gpu_check.sh D
set -euo pipefail

OUT=${1:?usage: gpu_check.sh OUTDIR}
DEVICE=${DEVICE:-cuda}
SHAPE=${SHAPE:-llama2-7b}
BUDGET_GIB=${BUDGET_GIB:-40}
PYTHON=${PYTHON:-python}
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
START=$(date +%s)

step() {  # step NAME SECONDS CMD...: run with a time limit, log to OUT/NAME.log, keep going
  local name=$1 limit=$2
  shift 2
  echo "[$(( $(date +%s) - START ))s] $name (limit ${limit}s): $*"
  if timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1; then
    echo "    ok"
  else
    local rc=$?
    echo "    FAILED (exit $rc); last lines of $OUT/$name.log:"
    tail -n 20 "$OUT/$name.log" | sed 's/^/    | /'
    FAILED="${FAILED:-} $name"
  fi
}

if [[ $SHAPE == tiny ]]; then
  RATE=${RATE:-20}; SLO_ARGS=(); CHUNK=512; CAL=${CAL:-10}; DUR=${DUR:-15}
  REPLAY=${REPLAY:-10}
else
  # Llama-2-7B on an H200: a decode step is ~10 ms, a 2048-token prefill ~50 ms. 6 req/s of
  # ~200-token prompts and ~128-token outputs keeps about 20-40 sequences running.
  RATE=${RATE:-6}; SLO_ARGS=(--ttft-slo 0.5 --tpot-slo 0.03); CHUNK=2048; CAL=30; DUR=60
  REPLAY=30
fi
COMMON=(--device "$DEVICE" --shape "$SHAPE" --budget-gib "$BUDGET_GIB" --rate "$RATE"
        --chunk "$CHUNK" --output-median 128 "${SLO_ARGS[@]}")
[[ $SHAPE == tiny ]] && COMMON=(--device "$DEVICE" --shape "$SHAPE" --budget-gib "$BUDGET_GIB"
                                --rate "$RATE" --chunk "$CHUNK")

step environment 30 "$PYTHON" - <<'PY'
import json, platform, torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
        "cuda_available": torch.cuda.is_available()}
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    info.update(name=p.name, total_memory=p.total_memory, sms=p.multi_processor_count)
print(json.dumps(info, indent=2))
PY
cp "$OUT/environment.log" "$OUT/environment.json" || true

PROFILE="$OUT/$SHAPE-${BUDGET_GIB}gib-$DEVICE-measured.json"
step profile 200 "$PYTHON" scripts/profile_executor.py --device "$DEVICE" --shape "$SHAPE" \
  --budget-gib "$BUDGET_GIB" --quick --out "$PROFILE" \
  --compare checkpoints/profiles/h200-llama2-7b-40gib-roofline.json

if [[ -f $PROFILE ]]; then
  step serve_replay 90 "$PYTHON" scripts/serve_replay.py "${COMMON[@]}" --duration "$REPLAY" \
    --controller pid --out "$OUT/serve_replay.json"
  step fidelity 200 "$PYTHON" scripts/fidelity.py "${COMMON[@]}" --duration "$DUR" \
    --calibrate-seconds "$CAL" --profile "$PROFILE" --json --out "$OUT/fidelity.json"
  # the measured profile against the roofline one, coefficient by coefficient (measured over
  # roofline; profile_executor.py --compare wrote them): a coefficient off by more than a factor
  # of 4 is named, so a roofline assumption that fails on the device shows at once
  step roofline_check 30 "$PYTHON" - "$PROFILE" <<'PY'
import json, sys
fit = json.load(open(sys.argv[1]))["fit"]
ratios = fit.get("vs_reference", {}).get("ratio", {})
if not ratios:
    sys.exit("the profile has no comparison with the roofline profile")
print(json.dumps(ratios, indent=2))
off = {k: v for k, v in ratios.items() if v is not None and v > 0 and not 0.25 <= v <= 4}
print("off by more than 4x:", off or "none")
PY
else
  echo "no profile was written: skipping the replay and the fidelity steps"
  FAILED="${FAILED:-} serve_replay fidelity"
fi

echo "[$(( $(date +%s) - START ))s] done; results in $OUT"
if [[ -n ${FAILED:-} ]]; then
  echo "failed steps:$FAILED"
  exit 1
fi
