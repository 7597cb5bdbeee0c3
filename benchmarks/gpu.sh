#!/usr/bin/env bash
# One single-GPU run (H200) in at most 10 minutes of wall time, every compile included:
# correctness checks, the quality run (ELECTRA-Small pre-trained for minutes, then GLUE from it
# and from random init), then step time and MFU beside the PyTorch reference.
#
#   benchmarks/gpu.sh                  # on the GPU machine (docs/performance.md: the command)
#   benchmarks/gpu.sh --cpu            # the same script with tiny shapes, to test it on a CPU
#   benchmarks/gpu.sh --parts=quality  # some of: checks, quality, speed (default: all three)
#
# Needs .gpu_data/ (python benchmarks/gpu_data.py --corpus=DIR --glue=DIR on a CPU machine;
# GPU_DATA names another folder) for the quality part, and installs the wheels in .whl/ first when that
# folder holds any (benchmarks/gpu_wheels.sh fetches the ones the H200 image lacks).
#
# The budget, in seconds of wall time on one H200. Each part runs under its own `timeout`,
# capped by what is left of TOTAL; a part or a row that would start with too little time left is
# skipped and says so. Change a part's share here (or BUDGET_TOTAL, BUDGET_CHECKS,
# BUDGET_PRETRAIN, BUDGET_FINETUNE in the environment).
#
#   part       seconds  what
#   setup         15    wheels from .whl/ (measured, not capped)
#   checks        60    at once: cuDNN vs einsum logits (base, 512 tokens), bf16 vs float32
#                       losses (tiny), the train command sent SIGTERM after its first compile
#   pretrain     240    ELECTRA-Small, bf16, 12,000 steps of 128 x 128 (configs/gpu_quality.py;
#                       ~16 ms a step), compile and held-out evaluations included; SIGTERM at
#                       the budget, and fine-tuning starts from the checkpoint it saves
#   finetune     120    SST-2 (20,000 examples), MRPC, STS-B, CoLA, RTE, seed 0, from the
#                       pre-trained run and from random init: 10 runs at once on the one GPU
#   speed       ~150    the rest: rows in order of value until TOTAL is spent: base@512, large@512,
#                       small@128 with cuDNN attention, each beside the PyTorch reference
#                       (torch.compile) on the same shape, then the same with einsum attention
#   TOTAL        590    of the device call's 600 s limit
#
# Order: the checks first, as they decide whether any timing means something, and all three at
# once, as none is timed; then quality, the result nothing else can give; speed last, as its
# rows are independent and each one written is kept.
#
# Writes under $OUT (default /tmp/gpu_bench), each file as soon as its part has it:
#   checks.jsonl           one line per correctness check (`check`, `ok`, figures)
#   h200_quality.json      benchmarks/gpu_quality.py's summary (pretrain_flops, pretrain_seconds,
#                          tokens, disc_auc, electra / random_init dev scores and averages)
#   pretrain_metrics.jsonl the pre-training's metrics.jsonl (held-out readings under eval/)
#   results.jsonl          one row per timed configuration: the rows of
#                          benchmarks/results/h200.jsonl (label, attention, batch, seq,
#                          median_s_per_step, tokens_per_sec, mfu, compile_s,
#                          reference_s_per_step, reference_first_step_s, speedup, ...)
#   table.txt              the speed table, the checks and the quality summary
#   gpu.log                everything the script and its commands printed
# Work folders (runs, checkpoints) go to a new folder in /tmp; PEER names the PyTorch reference
# (default: benchmarks/reference/peer_torch_electra.py, else .gpu_data/bench/'s copy).
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)
OUT=${OUT:-/tmp/gpu_bench}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu.log") 2>&1
export PYTHONUNBUFFERED=1

cpu=0
parts="checks,quality,speed"
for arg in "$@"; do
  case $arg in
    --cpu) cpu=1 ;;
    --parts=*) parts=${arg#--parts=} ;;
    *) echo "error: unknown argument $arg; use --cpu and --parts=checks,quality,speed"; exit 2 ;;
  esac
done
for p in ${parts//,/ }; do
  case $p in checks | quality | speed) ;; *) echo "error: --parts: unknown part $p"; exit 2 ;; esac
done
want() { [[ ",$parts," == *",$1,"* ]]; }

if [ $cpu -eq 1 ]; then  # tiny shapes; a 2-core CPU is slower at everything, so the time is ample
  TOTAL=${BUDGET_TOTAL:-3600}
  B_CHECKS=${BUDGET_CHECKS:-600}; B_PRETRAIN=${BUDGET_PRETRAIN:-600}
  B_FINETUNE=${BUDGET_FINETUNE:-1200}
  steps="--steps 2 --warmup 1"
  attention=xla
  small_cfg="configs/tiny.py"; base_cfg="configs/tiny.py"; large_cfg="configs/tiny.py"
  b128="8 4"; b512="4 2"; l512="4 2"; seq_long=128
  peer_args="--device cpu --dtype float32 --steps 2 --warmup 1"
  base_size=small; large_size=small
  quality_args="--cpu --parallel 2"
  # The tiny programs' numbers are not what is tested; XLA's heavy passes would take most of it.
  export JAX_DISABLE_MOST_OPTIMIZATIONS=${JAX_DISABLE_MOST_OPTIMIZATIONS:-1}
else
  TOTAL=${BUDGET_TOTAL:-590}
  B_CHECKS=${BUDGET_CHECKS:-60}; B_PRETRAIN=${BUDGET_PRETRAIN:-240}
  B_FINETUNE=${BUDGET_FINETUNE:-120}
  steps="--steps 10 --warmup 3"
  attention=cudnn
  small_cfg="configs/small.py"; base_cfg="configs/base.py"; large_cfg="configs/large.py"
  b128="512 256 128"; b512="128 64 32"; l512="64 32 16"; seq_long=512
  peer_args="--device cuda --dtype bfloat16 --steps 10 --warmup 5 --compile"
  base_size=base; large_size=large
  quality_args="--parallel 10"
fi
MIN_ROW=${MIN_ROW:-30}  # a speed row is not started with less time left than this

left() { echo $((START + TOTAL - $(date +%s))); }
cap() { local l; l=$(left); echo $(($1 < l ? $1 : l)); }  # cap SECONDS: at most what is left

WORK=$(mktemp -d /tmp/electra_jax_gpu.XXXXXX)
rows="$WORK/rows.jsonl"
results="$OUT/results.jsonl"
checks="$OUT/checks.jsonl"
: >"$rows"; : >"$results"; : >"$checks"
echo "gpu.sh: parts $parts, budget ${TOTAL}s, work folder $WORK, results in $OUT"

# Setup: wheels the device image lacks (benchmarks/gpu_wheels.sh: built for its Python, 3.12,
# so not installed with --cpu).
if [ $cpu -eq 0 ] && [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
GPU_DATA=${GPU_DATA:-.gpu_data}
PEER=${PEER:-}
for p in benchmarks/reference/peer_torch_electra.py "$GPU_DATA/bench/peer_torch_electra.py"; do
  [ -z "$PEER" ] && [ -f "$p" ] && PEER=$p
done
echo "setup: $(($(date +%s) - START))s; reference: ${PEER:-none found}"

check() {  # check JSON: one line into checks.jsonl and the log
  echo "$1" | tee -a "$checks"
}

bench() {  # bench LIMIT LABEL ARGS... -> one JSON row (with the label) into rows, or non-zero
  local limit=$1 label=$2 line
  shift 2
  line=$(timeout "$limit" python3 benchmarks/train_step.py "$@" | tail -n 1)
  [[ "$line" == "{"* ]] || return 1
  python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r["label"]=sys.argv[2]; print(json.dumps(r))' \
    "$line" "$label" | tee -a "$rows"
}

# ---------------------------------------------------------------------------------- checks
sigterm_check() {  # the train command ended by SIGTERM right after its first compile
  local workdir="$WORK/sigterm" log="$WORK/sigterm.log" pid code t0 limit=$1 tok=() pieces
  # The carried tokenizer, when there is one, spares training one on the builtin corpus.
  if [ -f "$GPU_DATA/tokenizer/spm.model" ]; then
    pieces=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' \
      "$GPU_DATA/gpu_data.json")
    tok=(--config.data.tokenizer="$GPU_DATA/tokenizer" --config.data.vocab_size="$pieces")
  fi
  timeout "$limit" python3 -m electra_jax.train --config=configs/tiny.py --workdir="$workdir" \
    --config.train.num_steps=100000 --config.log.every_steps=1000 --config.eval.every_steps=0 \
    "${tok[@]}" >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 $((limit * 2))); do
    grep -q "compiled the" "$log" 2>/dev/null && break
    kill -0 $pid 2>/dev/null || break
    sleep 0.5
  done
  sleep 2
  t0=$(date +%s)
  kill -TERM $pid 2>/dev/null
  wait $pid
  code=$?
  python3 - "$code" "$(($(date +%s) - t0))" "$workdir" "$log" <<'PY'
import json, os, sys
code, seconds, workdir, log = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
text = open(log).read()
folder = os.path.join(workdir, "checkpoints")
saved = sorted(int(n) for n in os.listdir(folder) if n.isdigit()) if os.path.isdir(folder) else []
ok = code == 0 and bool(saved) and "preempted at step" in text
last = [line for line in text.splitlines() if line.strip()][-1:]
print(json.dumps({"check": "SIGTERM after the first compile", "exit_code": code,
                  "seconds_to_exit": seconds, "checkpoints": saved, "ok": ok,
                  "last_line": last[0][-300:] if last else ""}))
PY
}

parity_ok=1
if want checks; then
  limit=$(cap "$B_CHECKS")
  # None of the three is timed, so they share the device; each allocates as it goes.
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
  timeout "$limit" python3 benchmarks/attention_parity.py --config="$base_cfg" \
    --attention "$attention" --seq "$seq_long" >"$WORK/parity.json" &
  p_parity=$!
  sigterm_check "$limit" >"$WORK/sigterm.json" &
  p_sigterm=$!
  tiny="--config=configs/tiny.py --seq 128 --batch 8 --steps 2 --warmup 1"
  bench "$limit" "tiny f32" $tiny
  bench "$limit" "tiny bf16" $tiny --dtype bfloat16
  wait $p_parity
  parity_code=$?
  wait $p_sigterm
  unset XLA_PYTHON_CLIENT_PREALLOCATE
  line=$(tail -n 1 "$WORK/parity.json")
  [[ "$line" == "{"* ]] || line="{\"check\": \"attention parity\", \"ok\": false, \"exit_code\": $parity_code}"
  check "$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); r.setdefault("check", "attention parity"); print(json.dumps(r))' "$line")"
  [ "$parity_code" -eq 0 ] || parity_ok=0
  check "$(python3 - "$rows" <<'PY'
import json, sys
rows = {r["label"]: r for r in map(json.loads, open(sys.argv[1]))}
a, b = rows.get("tiny f32"), rows.get("tiny bf16")
ok = bool(a and b and a["finite"] and b["finite"]
          and abs(a["last_loss"] - b["last_loss"]) / a["last_loss"] < 0.05)
print(json.dumps({"check": "bf16 vs float32 on tiny", "f32_loss": a and a["last_loss"],
                  "bf16_loss": b and b["last_loss"], "ok": ok}))
PY
)"
  line=$(tail -n 1 "$WORK/sigterm.json")
  [[ "$line" == "{"* ]] || line='{"check": "SIGTERM after the first compile", "ok": false}'
  check "$line"
  echo "checks: $(($(date +%s) - START))s elapsed"
fi

# --------------------------------------------------------------------------------- quality
if want quality; then
  if [ "$(left)" -lt 60 ]; then
    echo "quality: skipped, $(left)s left of the budget"
  else
    # The pre-training stops itself at its budget; the outer timeout only catches a hang.
    timeout "$(cap $((B_PRETRAIN + B_FINETUNE + 60)))" python3 benchmarks/gpu_quality.py \
      --data "$GPU_DATA" --out "$OUT" --workdir "$WORK/quality" $quality_args \
      --pretrain_seconds "$(cap "$B_PRETRAIN")" --finetune_seconds "$B_FINETUNE"
    echo "quality: exit $?, $(($(date +%s) - START))s elapsed"
  fi
fi

# ----------------------------------------------------------------------------------- speed
reference() {  # reference LABEL SIZE BATCH SEQ: the PyTorch step on the same shape, into results
  local label=$1 size=$2 batch=$3 seq=$4 cached="$WORK/peer-$2-$3-$4" line="" l
  if [ -n "$PEER" ] && [ ! -f "$cached.json" ]; then
    l=$(left)
    if [ "$l" -ge "$MIN_ROW" ]; then
      timeout "$l" python3 "$PEER" $peer_args --size "$size" --batch "$batch" --seq "$seq" \
        >"$cached.json" 2>"$cached.err"
    else
      echo "{\"label\": \"$label\", \"reference\": \"skipped: budget\"}"
    fi
  fi
  [ -f "$cached.json" ] && line=$(tail -n 1 "$cached.json")
  python3 - "$rows" "$label" "$line" "$results" "$cached.err" <<'PY'
import json, os, re, sys
rows, label, line, results, err = sys.argv[1:]
ours = [r for r in map(json.loads, open(rows)) if r.get("label") == label][-1]
ref = json.loads(line) if line.strip().startswith("{") else {}
# The reference compiles (torch.compile) in its first warm-up step, which it logs.
first = re.search(r"warmup 0: ([0-9.]+)s", open(err).read()) if os.path.isfile(err) else None
keys = ("attention", "dtype", "batch", "seq", "median_s_per_step", "tokens_per_sec", "mfu",
        "compile_s", "steps_per_call", "scan_layers", "device", "jax")
row = {"label": label, **{k: ours.get(k) for k in keys},
       "reference_s_per_step": ref.get("median_s_per_step"),
       "reference_first_step_s": float(first.group(1)) if first else None,
       "reference": {k: ref.get(k) for k in ("torch", "transformers", "compiled", "attn_impl")}
       if ref else None}
row["speedup"] = (round(row["reference_s_per_step"] / row["median_s_per_step"], 3)
                  if row["reference_s_per_step"] else None)
print(json.dumps(row))
with open(results, "a") as f:
    f.write(json.dumps(row) + "\n")
PY
}

largest() {  # largest LABEL SIZE SEQ "B1 B2 ..." ARGS...: the first batch (largest first) that fits
  local label=$1 size=$2 seq=$3 batches=$4 l
  shift 4
  for b in $batches; do
    l=$(left)
    if [ "$l" -lt "$MIN_ROW" ]; then
      echo "{\"label\": \"$label\", \"status\": \"skipped: budget ($l s left)\"}"
      return 1
    fi
    if bench "$l" "$label" --batch "$b" --seq "$seq" "$@"; then
      reference "$label" "$size" "$b" "$seq"
      return 0
    fi
    echo "{\"label\": \"$label\", \"batch\": $b, \"status\": \"failed (out of memory or out of time)\"}"
  done
  return 1
}

if want speed; then
  # bf16 compute; fused attention needs the attention-probability dropout off, so the paper's
  # einsum attention (with it) is timed too. cuDNN rows only when the parity check passed.
  fused="--set model.attention=$attention --set model.attention_dropout_rate=0.0"
  common="--dtype bfloat16 $steps"
  if [ $parity_ok -eq 1 ]; then
    largest "base${seq_long} $attention" "$base_size" "$seq_long" "$b512" --config=$base_cfg $common $fused
    largest "large${seq_long} $attention" "$large_size" "$seq_long" "$l512" --config=$large_cfg $common $fused
    largest "small128 $attention" small 128 "$b128" --config=$small_cfg $common $fused
  else
    echo "speed: no $attention rows, the attention parity check failed"
  fi
  largest "base${seq_long} einsum" "$base_size" "$seq_long" "$b512" --config=$base_cfg $common
  largest "large${seq_long} einsum" "$large_size" "$seq_long" "$l512" --config=$large_cfg $common
  largest "small128 einsum" small 128 "$b128" --config=$small_cfg $common
  echo "speed: $(($(date +%s) - START))s elapsed"
fi

# ----------------------------------------------------------------------------------- table
python3 - "$results" "$checks" "$OUT/h200_quality.json" <<'PY' | tee "$OUT/table.txt"
import json, os, sys
results, checks, quality = sys.argv[1:]
print(f"{'run':18} {'batch':>5} {'seq':>4} {'s/step':>8} {'MFU':>6} {'compile':>7} "
      f"{'torch s/step':>12} {'speed-up':>8}")
for r in map(json.loads, open(results)):
    mfu = "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}%"
    ref = r.get("reference_s_per_step")
    ratio = "-" if not r.get("speedup") else f"{r['speedup']:.2f}x"
    print(f"{r['label']:18} {r['batch']:>5} {r['seq']:>4} {r['median_s_per_step']:>8.4f} "
          f"{mfu:>6} {r['compile_s']:>6.1f}s {ref if ref else '-':>12} {ratio:>8}")
for c in map(json.loads, open(checks)):
    print(f"check: {c.get('check')}: {'ok' if c.get('ok') else 'FAILED'}")
if os.path.isfile(quality):
    q = json.load(open(quality))
    print(f"quality ({q.get('status')}): {q.get('pretrain_flops', 0):.3g} FLOPs, "
          f"{q.get('tokens', 0):,} tokens in {q.get('pretrain_seconds')}s, "
          f"held-out disc AUC {q.get('disc_auc')}")
    for init in ("electra", "random_init"):
        print(f"  {init:12} " + "  ".join(f"{k} {v}" for k, v in q.get(init, {}).items()))
    print(f"  gain (electra - random init average): {q.get('gain')}")
PY
echo "gpu.sh: done in $(($(date +%s) - START))s"
