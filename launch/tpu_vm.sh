#!/usr/bin/env bash
# ELECTRA pre-training on a Cloud TPU VM slice: create it (or reuse it, or re-create it when it
# was preempted), install electra_jax on every worker, and run the same
# `python -m electra_jax.train` on all of them. jax's own cluster detection (the TPU VM's
# metadata server) makes the workers one run: train.py starts jax.distributed when the slice
# has more than one host.
#
#   launch/tpu_vm.sh NAME ZONE ACCELERATOR_TYPE gs://BUCKET/PATH --config=configs/large.py [train flags]
#   e.g. launch/tpu_vm.sh electra-large us-central2-b v4-64 gs://b/runs/large --config=configs/large.py
#
# Every worker trains with --workdir=gs://BUCKET/PATH written directly: orbax writes the
# checkpoints there, and config.json, metrics.jsonl, the tokenizer and the prepared data go
# through etils.epath and gcsfs (the [gcs] extra); the run's lock is a lease object in the bucket.
# Process 0 prepares the data into WORKDIR/data (the default data.cache_dir; one set elsewhere
# must be gs:// too, so that every worker reads the same shards) while the others wait, every
# worker writes its part of each checkpoint, and jax's compilation cache lives next to the
# workdir (gs://BUCKET/.../jax_compilation_cache) so that a restarted slice does not compile
# again. The slice's service account needs read and write access to the bucket.
#
# Preemption: run the script again with the same arguments. A slice that is READY is reused, one
# that was PREEMPTED (a spot slice stays listed in that state) is deleted and created again, and
# the run resumes from its last checkpoint. With QUEUED=1 the slice is requested as a queued
# resource (Google's path for preemptible capacity: the request waits in the queue until
# capacity is free); a queued resource that was preempted (SUSPENDED) or FAILED is deleted and
# requested again, and the script waits until it is ACTIVE.
#
# Environment: PROJECT (gcloud project, default: gcloud's), RUNTIME (TPU software version,
# default: the one Google documents for the accelerator, below), REPO (a git URL cloned on every
# worker instead of shipping this checkout; configs/ comes with either), SPOT=1 for a spot
# slice, QUEUED=1 for a queued resource (each switch 0 or 1: SPOT=yes is refused, not read as
# off), POLL_SECONDS (default 60) between state checks; checked by the launchers' shared rules
# (launch/_rules.sh) before anything is created.
set -euo pipefail
# shellcheck source=launch/_rules.sh
source "$(dirname "$0")/_rules.sh"
if [[ $# -lt 5 ]]; then
  echo "usage: $0 NAME ZONE ACCELERATOR_TYPE gs://BUCKET/PATH --config=... [train flags]" >&2
  exit 2
fi
name=$1 zone=$2 type=$3 run=$4
shift 4
[[ $run == gs://* ]] || launcher_fail "the run's location must be gs://BUCKET/PATH, got $run"
check_workdir "$run" # the bucket's name, with why it is refused
workdir=${run%/}
# Both of absl's forms (--name=VALUE and --name VALUE), as train reads them.
if [[ -n $(flag_value workdir "$@") ]]; then
  launcher_fail "drop --workdir from the train flags; the workdir is $workdir"
fi
cache_dir=$(flag_value config.data.cache_dir "$@")
if [[ -n $cache_dir && $cache_dir != gs://* ]]; then
  launcher_fail "--config.data.cache_dir=$cache_dir must be gs://...: every worker reads the prepared data from there"
fi
spot_switch=$(switch SPOT)
queued_switch=$(switch QUEUED)
poll=$(whole_number POLL_SECONDS 60 0 86400)
# Google's TPU software versions per generation (cloud.google.com/tpu/docs/runtimes). They ship
# Python 3.10, older than setup.py's python_requires (3.11): the install below brings its own.
case $type in
  v5litepod-* | v5e-*) runtime=v2-alpha-tpuv5-lite ;;
  v5p-*) runtime=v2-alpha-tpuv5 ;;
  v6e-*) runtime=v2-alpha-tpuv6e ;;
  *) runtime=tpu-ubuntu2204-base ;; # v2, v3, v4
esac
runtime=${RUNTIME:-$runtime}
project_flag=()
[[ -n "${PROJECT:-}" ]] && project_flag=(--project="$PROJECT")
spot=()
[[ $spot_switch == 1 ]] && spot=(--spot)
tpu=(gcloud compute tpus tpu-vm "${project_flag[@]}")
queued=(gcloud compute tpus queued-resources "${project_flag[@]}")

# The state gcloud reports for `describe`, NOT_FOUND when there is none; any other failure
# (credentials, a wrong zone) ends the script with gcloud's message.
state_of() {
  local out
  if out=$("$@" --zone="$zone" 2>&1); then
    echo "$out"
  elif [[ $out == *NOT_FOUND* || $out == *"not found"* ]]; then
    echo NOT_FOUND
  else
    echo "$out" >&2
    return 1
  fi
}

if [[ $queued_switch == 1 ]]; then
  state=$(state_of "${queued[@]}" describe "$name" --format='value(state.state)')
  case $state in
    FAILED | SUSPENDING | SUSPENDED)
      echo "queued resource $name is $state: deleting it and requesting it again" >&2
      "${queued[@]}" delete "$name" --zone="$zone" --force --quiet
      state=NOT_FOUND
      ;;
  esac
  if [[ $state == NOT_FOUND ]]; then
    "${queued[@]}" create "$name" --zone="$zone" --node-id="$name" \
      --accelerator-type="$type" --runtime-version="$runtime" "${spot[@]}"
  fi
  while true; do
    state=$(state_of "${queued[@]}" describe "$name" --format='value(state.state)')
    case $state in
      ACTIVE) break ;;
      FAILED | SUSPENDING | SUSPENDED | NOT_FOUND)
        echo "$0: queued resource $name is $state; run the script again to request it anew" >&2
        exit 1
        ;;
    esac
    echo "queued resource $name: $state; checking again in ${poll}s" >&2
    sleep "$poll"
  done
else
  state=$(state_of "${tpu[@]}" describe "$name" --format='value(state)')
  case $state in
    READY) ;;
    PREEMPTED | TERMINATED)
      # A preempted slice keeps its name but runs nothing: only a new one can train.
      echo "TPU $name is $state: deleting it and creating it again" >&2
      "${tpu[@]}" delete "$name" --zone="$zone" --quiet
      state=NOT_FOUND
      ;;
    STOPPED)
      "${tpu[@]}" start "$name" --zone="$zone"
      ;;
    NOT_FOUND) ;;
    *)
      echo "$0: TPU $name is $state; run the script again once it is READY (or delete it)" >&2
      exit 1
      ;;
  esac
  if [[ $state == NOT_FOUND ]]; then
    "${tpu[@]}" create "$name" --zone="$zone" --accelerator-type="$type" \
      --version="$runtime" "${spot[@]}"
  fi
fi

# Every worker gets the tree in ~/electra_jax (configs/ included) and runs from there.
if [[ -z "${REPO:-}" ]]; then
  # Ship this checkout to every worker, without runs/, git's history, caches, a virtual
  # environment made in it (.venv/ or venv/: gigabytes, and of this machine) or the GPU wheels.
  here=$(cd "$(dirname "$0")/.." && pwd)
  archive=$(mktemp -d)/electra_jax.tgz
  tar -C "$here" --exclude=./runs --exclude=.git --exclude='*.egg-info' --exclude=__pycache__ \
    --exclude=.pytest_cache --exclude=.ruff_cache --exclude=./.venv --exclude=./venv \
    --exclude=./.whl -czf "$archive" .
  "${tpu[@]}" scp "$archive" "$name":~/ --zone="$zone" --worker=all
  rm -rf "$(dirname "$archive")"
  fetch='mkdir -p ~/electra_jax && tar -C ~/electra_jax -xzf ~/electra_jax.tgz'
else
  fetch="rm -rf ~/electra_jax && git clone -q '$REPO' ~/electra_jax"
fi
# Python 3.11 in a virtual environment made by uv (docs.astral.sh/uv), which downloads a
# standalone CPython when the image has none: the runtimes' own Python is 3.10, and uv is how
# Google's JAX projects on TPU VMs (MaxText, MaxDiffusion) get a newer one. The versions are
# constraints-tpu.txt's, the TPU image's lock (launch/docker/lock.py: every package pip resolves
# for the TPU extras, libtpu included, pinned, constraints.txt's tested versions among them);
# constraints.txt is a CPU freeze that pins neither libtpu nor what only the TPU extras pull in.
venv='~/electra_venv'
install="$fetch && python3 -m pip install -q --user uv && \
(test -x $venv/bin/python || ~/.local/bin/uv venv -q --python 3.11 $venv) && \
~/.local/bin/uv pip install -q --python $venv/bin/python -c ~/electra_jax/constraints-tpu.txt \
-e ~/electra_jax'[tpu,gcs]'"
"${tpu[@]}" ssh "$name" --zone="$zone" --worker=all --command="$install"

# The same command on every worker; quoted so that globs and gs:// paths reach python intact.
args=$(printf '%q ' "--workdir=$workdir" "$@")
cache=""
beside=$(cache_beside "$workdir") # none beside a workdir that is a whole bucket
if [[ -n $beside ]]; then
  cache="JAX_COMPILATION_CACHE_DIR=$(printf '%q' "$beside") "
fi
"${tpu[@]}" ssh "$name" --zone="$zone" --worker=all \
  --command="cd ~/electra_jax && $cache$venv/bin/python -m electra_jax.train $args"
