#!/usr/bin/env bash
# ELECTRA pre-training on a Cloud TPU VM slice: create it (or reuse it), install electra_jax on
# every worker, and run the same `python -m electra_jax.train` on all of them. On a TPU VM,
# jax.distributed finds the other workers by itself (train.py starts it when the slice has more
# than one host).
#
#   launch/tpu_vm.sh NAME ZONE ACCELERATOR_TYPE gs://BUCKET/PATH --config=configs/large.py [train flags]
#   e.g. launch/tpu_vm.sh electra-large us-central2-b v4-64 gs://b/runs/large --config=configs/large.py
#
# Every worker mounts BUCKET at /mnt/BUCKET with Cloud Storage FUSE (gcsfuse) and trains with
# --workdir=/mnt/BUCKET/PATH: config.json, metrics.jsonl, the tokenizer and the prepared data are
# written with ordinary file calls (a gs:// workdir is refused), and the mount gives every worker
# the same files. Process 0 prepares the data into WORKDIR/data (the default data.cache_dir; one
# set elsewhere must be under /mnt/BUCKET too) while the others wait, every worker writes its part
# of each checkpoint, and a preempted slice resumes by running this script again with the same
# arguments. The slice's service account needs read and write access to the bucket. Environment:
# PROJECT (gcloud project, default: gcloud's), RUNTIME (TPU software version, default
# tpu-ubuntu2204-base), REPO (what `pip install` gets, default this checkout copied to the
# workers), SPOT=1 for a spot slice.
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
bucket=${BASH_REMATCH[1]}
mount=/mnt/$bucket
workdir=$mount${BASH_REMATCH[2]%/}
for arg in "$@"; do
  case $arg in
    --workdir | --workdir=*)
      echo "$0: drop $arg; the workdir is $workdir, from $run" >&2
      exit 2
      ;;
    --config.data.cache_dir= | "--config.data.cache_dir=$mount/"*) ;;
    --config.data.cache_dir*)
      echo "$0: $arg must be under $mount, which every worker mounts" >&2
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

# Mount the bucket on every worker (gcsfuse from Google's apt repository, the first time). A
# directory rename on a bucket without hierarchical namespace is a copy and delete that gcsfuse
# refuses by default; --rename-dir-limit allows it, for the prepared data, the tokenizer and
# orbax's checkpoints, which are each built under a temporary name and renamed into place.
apt_get='sudo DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600'
mount_bucket="command -v gcsfuse >/dev/null || {
  echo \"deb [signed-by=/usr/share/keyrings/cloud.google.asc] https://packages.cloud.google.com/apt gcsfuse-\$(lsb_release -cs) main\" | sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null &&
  curl -fsSL https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null &&
  $apt_get update && $apt_get install -y gcsfuse; } &&
{ mountpoint -q $mount || { sudo mkdir -p $mount && sudo chown \$(id -u):\$(id -g) $mount &&
  gcsfuse --implicit-dirs --rename-dir-limit=100000 $bucket $mount; }; }"
"${tpu[@]}" ssh "$name" --zone="$zone" --worker=all --command="$mount_bucket"

# The same command on every worker; quoted so that globs and gs:// paths reach python intact.
args=$(printf '%q ' "--workdir=$workdir" "$@")
"${tpu[@]}" ssh "$name" --zone="$zone" --worker=all \
  --command="cd ~/electra_jax 2>/dev/null || cd ~; python3 -m electra_jax.train $args"
