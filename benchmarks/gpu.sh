#!/usr/bin/env bash
# One single-GPU run (H200) of at most ~8 minutes: correctness first, then step time and MFU.
#
#   benchmarks/gpu.sh            # on the GPU machine (device tool: carry .whl if ml_collections
#                                # or sentencepiece are missing there; they are installed first)
#   benchmarks/gpu.sh --cpu      # the same script with tiny shapes, to test it on a CPU
#
# Prints one JSON line per measurement and a table last. Each measurement is a separate
# process, so an out-of-memory batch only costs its own try: the next smaller batch follows.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_bench}
mkdir -p "$OUT"
rows="$OUT/rows.jsonl"
: >"$rows"

bench() {  # bench LABEL ARGS... -> appends one JSON row (with the label) or returns non-zero
  local label=$1
  shift
  local line
  line=$(python3 benchmarks/train_step.py "$@" 2>>"$OUT/stderr.log" | tail -n 1) || return 1
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r["label"]=sys.argv[2]; print(json.dumps(r))' \
    "$line" "$label" | tee -a "$rows"
}

largest() {  # largest LABEL "B1 B2 ..." ARGS...: the first batch (largest first) that fits
  local label=$1 batches=$2
  shift 2
  for b in $batches; do
    if bench "$label" --batch "$b" "$@"; then return 0; fi
    echo "{\"label\": \"$label\", \"batch\": $b, \"status\": \"failed (likely out of memory)\"}"
  done
  return 1
}

if [ "${1:-}" = "--cpu" ]; then
  steps="--steps 2 --warmup 1"
  small="--config=configs/tiny.py --seq 64"
  attention=xla
  base_cfg="configs/tiny.py"; large_cfg="configs/tiny.py"
  b128="8 4"; b512="4 2"; l512="4 2"
else
  steps="--steps 10 --warmup 3"
  small="--config=configs/tiny.py --seq 128"
  attention=cudnn
  base_cfg="configs/base.py"; large_cfg="configs/large.py"
  b128="512 256 128"; b512="128 64 32"; l512="64 32 16"
fi

# 1. Correctness: finite losses, and bf16 tracks float32 on the tiny model (same ids, same seed).
bench "tiny f32" $small --batch 8 $steps
bench "tiny bf16" $small --batch 8 $steps --dtype bfloat16
python3 - "$rows" <<'PY'
import json, sys
rows = {r["label"]: r for r in map(json.loads, open(sys.argv[1]))}
a, b = rows["tiny f32"], rows["tiny bf16"]
ok = a["finite"] and b["finite"] and abs(a["last_loss"] - b["last_loss"]) / a["last_loss"] < 0.05
print(json.dumps({"check": "bf16 vs float32 on tiny", "f32_loss": a["last_loss"],
                  "bf16_loss": b["last_loss"], "ok": ok}))
sys.exit(0 if ok else 1)
PY
[ $? -eq 0 ] || { echo "correctness check failed; no timings"; exit 1; }

# 2. Step time and MFU at the largest batch that fits, bf16 compute; fused attention needs the
#    attention-probability dropout off, so the paper's einsum attention is timed beside it.
fused="--set model.attention=$attention --set model.attention_dropout_rate=0.0"
largest "base seq128 $attention" "$b128" --config=$base_cfg --seq 128 --dtype bfloat16 $steps $fused
largest "base seq512 $attention" "$b512" --config=$base_cfg --seq 512 --dtype bfloat16 $steps $fused
largest "base seq512 einsum" "$b512" --config=$base_cfg --seq 512 --dtype bfloat16 $steps
largest "large seq512 $attention" "$l512" --config=$large_cfg --seq 512 --dtype bfloat16 $steps $fused

# 3. The table.
python3 - "$rows" <<'PY'
import json, sys
print(f"{'run':28} {'batch':>5} {'s/step':>8} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6}")
for r in map(json.loads, open(sys.argv[1])):
    mfu = "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
    print(f"{r['label']:28} {r['batch']:>5} {r['median_s_per_step']:>8.4f} "
          f"{r['tokens_per_sec']:>10.0f} {r['tflops_per_sec_per_device']:>8.2f} {mfu:>6}")
PY
