#!/usr/bin/env bash
# One single-GPU run (H200), every compile included: correctness first, then step time and MFU
# beside the PyTorch reference, then the train command ended by SIGTERM.
#
#   benchmarks/gpu.sh            # on the GPU machine (device tool: carry .whl if ml_collections
#                                # or sentencepiece are missing there; they are installed first)
#   benchmarks/gpu.sh --cpu      # the same script with tiny shapes, to test it on a CPU (its
#                                # reference rows are ELECTRA-Small's, so its ratios only show
#                                # that the plumbing works)
#
# Prints one JSON line per measurement and a table last; $OUT/results.jsonl holds one row per
# timed configuration (label, batch, seq, median_s_per_step, mfu, reference_s_per_step), the
# rows of benchmarks/results/h200.jsonl. Each measurement is a separate process under `timeout`,
# so an out-of-memory batch or a hang only costs its own try. PEER names the PyTorch reference
# (default: ../shared/bench/peer_torch_electra.py, or shared/bench/ inside the tree).
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
results="$OUT/results.jsonl"
: >"$rows"
: >"$results"
PEER=${PEER:-}
for p in ../shared/bench/peer_torch_electra.py shared/bench/peer_torch_electra.py; do
  [ -z "$PEER" ] && [ -f "$p" ] && PEER=$p
done

if [ "${1:-}" = "--cpu" ]; then
  steps="--steps 2 --warmup 1"
  small="--config=configs/tiny.py --seq 64"
  attention=xla
  small_cfg="configs/tiny.py"; base_cfg="configs/tiny.py"; large_cfg="configs/tiny.py"
  b128="8 4"; b512="4 2"; l512="4 2"; seq_long=128
  peer_args="--device cpu --dtype float32 --steps 2 --warmup 1"
  base_size=small; large_size=small
  limit=300
else
  steps="--steps 10 --warmup 3"
  small="--config=configs/tiny.py --seq 128"
  attention=cudnn
  small_cfg="configs/small.py"; base_cfg="configs/base.py"; large_cfg="configs/large.py"
  b128="512 256 128"; b512="128 64 32"; l512="64 32 16"; seq_long=512
  peer_args="--device cuda --dtype bfloat16 --steps 10 --warmup 5 --compile"
  base_size=base; large_size=large
  limit=240
fi

bench() {  # bench LABEL ARGS... -> appends one JSON row (with the label) or returns non-zero
  local label=$1
  shift
  local line
  line=$(timeout "$limit" python3 benchmarks/train_step.py "$@" 2>>"$OUT/stderr.log" | tail -n 1)
  [ -n "$line" ] || return 1
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r["label"]=sys.argv[2]; print(json.dumps(r))' \
    "$line" "$label" | tee -a "$rows"
}

reference() {  # reference LABEL SIZE BATCH SEQ: the PyTorch step on the same shape, into results
  local label=$1 size=$2 batch=$3 seq=$4 line=""
  if [ -n "$PEER" ]; then
    line=$(timeout "$limit" python3 "$PEER" $peer_args --size "$size" --batch "$batch" --seq "$seq" \
      2>>"$OUT/stderr.log" | tail -n 1)
  fi
  python3 - "$rows" "$label" "$line" "$results" <<'PY'
import json, sys
rows, label, line, results = sys.argv[1:]
ours = [r for r in map(json.loads, open(rows)) if r.get("label") == label][-1]
ref = json.loads(line) if line.strip().startswith("{") else {}
row = {"label": label, "batch": ours["batch"], "seq": ours["seq"],
       "median_s_per_step": ours["median_s_per_step"], "mfu": ours.get("mfu"),
       "reference_s_per_step": ref.get("median_s_per_step")}
print(json.dumps(row))
with open(results, "a") as f:
    f.write(json.dumps(row) + "\n")
PY
}

largest() {  # largest LABEL SIZE SEQ "B1 B2 ..." ARGS...: the first batch (largest first) that fits
  local label=$1 size=$2 seq=$3 batches=$4
  shift 4
  for b in $batches; do
    if bench "$label" --batch "$b" --seq "$seq" "$@"; then
      reference "$label" "$size" "$b" "$seq"
      return 0
    fi
    echo "{\"label\": \"$label\", \"batch\": $b, \"status\": \"failed (out of memory or over ${limit}s)\"}"
  done
  return 1
}

# 1. Correctness: fused attention against einsum on the same weights and a padded batch; finite
#    losses, and bf16 tracks float32 on the tiny model (same ids, same seed).
timeout "$limit" python3 benchmarks/attention_parity.py --config="$base_cfg" --attention "$attention" \
  --seq "$seq_long" 2>>"$OUT/stderr.log" | tee "$OUT/parity.json"
parity=${PIPESTATUS[0]}
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
[ $? -eq 0 ] && [ "$parity" -eq 0 ] || { echo "correctness check failed; no timings"; exit 1; }

# 2. Step time and MFU at the largest batch that fits, bf16 compute, each beside the PyTorch
#    reference on the same shape; fused attention needs the attention-probability dropout off,
#    so the paper's einsum attention is timed beside it.
fused="--set model.attention=$attention --set model.attention_dropout_rate=0.0"
largest "small128 $attention" small 128 "$b128" --config=$small_cfg --dtype bfloat16 $steps $fused
largest "base${seq_long} $attention" "$base_size" "$seq_long" "$b512" --config=$base_cfg --dtype bfloat16 $steps $fused
largest "base${seq_long} einsum" "$base_size" "$seq_long" "$b512" --config=$base_cfg --dtype bfloat16 $steps
largest "large${seq_long} $attention" "$large_size" "$seq_long" "$l512" --config=$large_cfg --dtype bfloat16 $steps $fused

# 3. The train command ended by SIGTERM right after its first compile: it saves and exits 0.
workdir="$OUT/sigterm"
rm -rf "$workdir"
timeout "$limit" python3 -m electra_jax.train --config=configs/tiny.py --workdir="$workdir" \
  --config.train.num_steps=100000 --config.log.every_steps=1000 >"$OUT/sigterm.log" 2>&1 &
pid=$!
for _ in $(seq 1 $((limit * 2))); do
  grep -q "compiled the" "$OUT/sigterm.log" 2>/dev/null && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.5
done
sleep 2
t0=$(date +%s)
kill -TERM $pid 2>/dev/null
wait $pid
code=$?
python3 - "$code" "$(( $(date +%s) - t0 ))" "$workdir" "$OUT/sigterm.log" <<'PY'
import json, os, sys
code, seconds, workdir, log = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
text = open(log).read()
saved = sorted(int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit()) \
    if os.path.isdir(os.path.join(workdir, "checkpoints")) else []
ok = code == 0 and bool(saved) and "preempted at step" in text
print(json.dumps({"check": "SIGTERM after the first compile", "exit_code": code,
                  "seconds_to_exit": seconds, "checkpoints": saved, "ok": ok}))
PY

# 4. The table.
python3 - "$results" <<'PY'
import json, sys
print(f"{'run':22} {'batch':>5} {'seq':>4} {'s/step':>8} {'MFU':>6} {'torch s/step':>12} {'speed-up':>8}")
for r in map(json.loads, open(sys.argv[1])):
    mfu = "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
    ref = r.get("reference_s_per_step")
    ratio = "-" if not ref else f"{ref / r['median_s_per_step']:.2f}x"
    print(f"{r['label']:22} {r['batch']:>5} {r['seq']:>4} {r['median_s_per_step']:>8.4f} {mfu:>6} "
          f"{ref if ref else '-':>12} {ratio:>8}")
PY
