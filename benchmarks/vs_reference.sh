#!/bin/bash
# The CPU train-step comparison of benchmarks/RESULTS.md: the PyTorch reference
# (benchmarks/reference/) and electra_jax alternately, ROUNDS times each, then the ratio of their
# medians. Usage: benchmarks/vs_reference.sh [ROUNDS]    (PEER_PYTHON: the reference's venv
# python, default /tmp/electra-peer-venv/bin/python, made by benchmarks/reference/setup_peer.sh)
# ALSO="--set train.steps_per_call=1" adds a third program to every round: electra_jax with
# those extra benchmarks/train_step.py arguments, reported beside the default.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
peer=${PEER_PYTHON:-/tmp/electra-peer-venv/bin/python}
args=(--batch 32 --seq 128 --steps 20 --warmup 8)
read -r -a also <<< "${ALSO:-}"
if [ ! -x "$peer" ]; then
  echo "vs_reference: no reference python at $peer; run benchmarks/reference/setup_peer.sh first" >&2
  exit 2
fi
median() { python -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
ours() { python benchmarks/train_step.py --config=configs/small.py "${args[@]}" "$@" 2>/dev/null | median median_s_per_step; }
ref=() mine=() alt=()
for r in $(seq 1 "$rounds"); do
  ref+=("$("$peer" benchmarks/reference/peer_torch_electra.py "${args[@]}" 2>/dev/null | median median_s_per_step)")
  mine+=("$(ours)")
  line="round $r: reference ${ref[-1]} s/step, electra_jax ${mine[-1]} s/step"
  if [ ${#also[@]} -gt 0 ]; then
    alt+=("$(ours "${also[@]}")")
    line+=", electra_jax ${also[*]} ${alt[-1]} s/step"
  fi
  echo "$line"
done
python - "${ref[*]}" "${mine[*]}" "${alt[*]:-}" "${also[*]:-}" <<'PY'
import statistics, sys
ref, ours = ([float(x) for x in a.split()] for a in sys.argv[1:3])
r, o = statistics.median(ref), statistics.median(ours)
print(f"median: reference {r:.3f} s/step, electra_jax {o:.3f} s/step, ratio {r / o:.2f}x")
if sys.argv[3]:
    a = statistics.median(float(x) for x in sys.argv[3].split())
    print(f"median: electra_jax {sys.argv[4]} {a:.3f} s/step, ratio {r / a:.2f}x")
PY
