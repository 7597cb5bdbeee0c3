#!/usr/bin/env bash
# ELECTRA pre-training on a Cloud TPU VM slice: create it (or reuse it), install electra_jax on
# every worker, and run the same `python -m electra_jax.train` on all of them. On a TPU VM,
# jax.distributed finds the other workers by itself (train.py starts it when the slice has more
# than one host).
#
#   launch/tpu_vm.sh NAME ZONE ACCELERATOR_TYPE gs://BUCKET/PATH --config=configs/large.py [train flags]
#   e.g. launch/tpu_vm.sh electra-large us-central2-b v4-64 gs://b/runs/large --config=configs/large.py
#
# Every worker trains with --workdir=gs://BUCKET/PATH written directly: orbax writes the
# checkpoints there, and config.json, metrics.jsonl, the tokenizer and the prepared data go
# through etils.epath and gcsfs (the [gcs] extra); the run's lock is a lease object in the bucket.
# Process 0 prepares the data into WORKDIR/data (the default data.cache_dir; one set elsewhere
# must be gs:// too, so that every worker reads the same shards) while the others wait, every
# worker writes its part of each checkpoint, and a preempted slice resumes by running this script
# again with the same arguments. The slice's service account needs read and write access to the
# bucket. Environment: PROJECT (gcloud project, default: gcloud's), RUNTIME (TPU software
# version, default tpu-ubuntu2204-base), REPO (a git URL cloned on every worker instead of
# shipping this checkout; configs/ comes with either), SPOT=1 for a spot slice.
set -euo pipefail
if [[ $# -lt 5 ]]; then
  echo "usage: $0 NAME ZONE ACCELERATOR_TYPE gs://BUCKET/PATH --config=... [train flags]" >&2
  exit 2
fi
name=$1 zone=$2 type=$3 run=$4
shift 4
if [[ ! $run =~ ^gs://([a-z0-9][a-z0-9._-]*)(/.*)?$ ]]; then
  echo "$0: the run's location must be gs://BUCKET/PATH, got $run" >&2
  exit 2
fi
workdir=${run%/}
for arg in "$@"; do
  case $arg in
    --workdir | --workdir=*)
      echo "$0: drop $arg; the workdir is $workdir" >&2
      exit 2
      ;;
    --config.data.cache_dir= | --config.data.cache_dir=gs://*) ;;
    --config.data.cache_dir*)
      echo "$0: $arg must be gs://...: every worker reads the prepared data from there" >&2
      exit 2
      ;;
  esac
done
project_flag=()
[[ -n "${PROJECT:-}" ]] && project_flag=(--project="$PROJECT")
tpu=(gcloud compute tpus tpu-vm "${project_flag[@]}")

if ! "${tpu[@]}" describe "$name" --zone="$zone" >/dev/null 2>&1; then
  extra=()
  [[ "${SPOT:-0}" == 1 ]] && extra=(--spot)
  "${tpu[@]}" create "$name" --zone="$zone" --accelerator-type="$type" \
    --version="${RUNTIME:-tpu-ubuntu2204-base}" "${extra[@]}"
fi

# Every worker gets the tree in ~/electra_jax (configs/ included) and runs from there.
if [[ -z "${REPO:-}" ]]; then
  # Ship this checkout (without runs/ and caches) to every worker.
  here=$(cd "$(dirname "$0")/.." && pwd)
  tar -C "$here" --exclude=./runs --exclude=.git --exclude='*.egg-info' -czf /tmp/electra_jax.tgz .
  "${tpu[@]}" scp /tmp/electra_jax.tgz "$name":~/ --zone="$zone" --worker=all
  fetch='mkdir -p ~/electra_jax && tar -C ~/electra_jax -xzf ~/electra_jax.tgz'
else
  fetch="rm -rf ~/electra_jax && git clone -q '$REPO' ~/electra_jax"
fi
install="$fetch && pip install -q -e ~/electra_jax'[tpu,gcs]'"
"${tpu[@]}" ssh "$name" --zone="$zone" --worker=all --command="$install"

# The same command on every worker; quoted so that globs and gs:// paths reach python intact.
args=$(printf '%q ' "--workdir=$workdir" "$@")
"${tpu[@]}" ssh "$name" --zone="$zone" --worker=all \
  --command="cd ~/electra_jax && python3 -m electra_jax.train $args"
