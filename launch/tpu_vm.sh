#!/usr/bin/env bash
# ELECTRA pre-training on a Cloud TPU VM slice: create it (or reuse it), install electra_jax on
# every worker, and run the same `python -m electra_jax.train` on all of them. On a TPU VM,
# jax.distributed finds the other workers by itself (train.py starts it when the slice has more
# than one host).
#
#   launch/tpu_vm.sh NAME ZONE ACCELERATOR_TYPE --config=configs/large.py --workdir=gs://BUCKET/runs/large
#   e.g. launch/tpu_vm.sh electra-large us-central2-b v4-64 --config=configs/large.py --workdir=gs://b/large
#
# The workdir must be a gs:// path (or other storage every worker sees): process 0 prepares the
# data there, every worker writes its part of each checkpoint, and a preempted slice resumes by
# running this script again with the same arguments. Environment: PROJECT (gcloud project,
# default: gcloud's), RUNTIME (TPU software version, default tpu-ubuntu2204-base), REPO (what
# `pip install` gets, default this checkout copied to the workers), SPOT=1 for a spot slice.
set -euo pipefail
if [[ $# -lt 4 ]]; then
  echo "usage: $0 NAME ZONE ACCELERATOR_TYPE --config=... --workdir=gs://... [train flags]" >&2
  exit 2
fi
name=$1 zone=$2 type=$3
shift 3
project_flag=()
[[ -n "${PROJECT:-}" ]] && project_flag=(--project="$PROJECT")
tpu=(gcloud compute tpus tpu-vm "${project_flag[@]}")

if ! "${tpu[@]}" describe "$name" --zone="$zone" >/dev/null 2>&1; then
  extra=()
  [[ "${SPOT:-0}" == 1 ]] && extra=(--spot)
  "${tpu[@]}" create "$name" --zone="$zone" --accelerator-type="$type" \
    --version="${RUNTIME:-tpu-ubuntu2204-base}" "${extra[@]}"
fi

if [[ -z "${REPO:-}" ]]; then
  # Ship this checkout (without runs/ and caches) to every worker.
  here=$(cd "$(dirname "$0")/.." && pwd)
  tar -C "$here" --exclude=./runs --exclude=.git --exclude='*.egg-info' -czf /tmp/electra_jax.tgz .
  "${tpu[@]}" scp /tmp/electra_jax.tgz "$name":~/ --zone="$zone" --worker=all
  install='mkdir -p ~/electra_jax && tar -C ~/electra_jax -xzf ~/electra_jax.tgz && pip install -q "jax[tpu]" -e ~/electra_jax'
else
  install="pip install -q 'jax[tpu]' '$REPO'"
fi
"${tpu[@]}" ssh "$name" --zone="$zone" --worker=all --command="$install"

# The same command on every worker; quoted so that globs and gs:// paths reach python intact.
args=$(printf '%q ' "$@")
"${tpu[@]}" ssh "$name" --zone="$zone" --worker=all \
  --command="cd ~/electra_jax 2>/dev/null || cd ~; python3 -m electra_jax.train $args"
