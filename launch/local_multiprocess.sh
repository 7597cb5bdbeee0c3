#!/usr/bin/env bash
# N processes of `python -m electra_jax.train` on this machine, talking over 127.0.0.1: a real
# multi-process (multi-host) run for testing, each process with its own simulated CPU devices.
#
#   launch/local_multiprocess.sh N --config=configs/tiny.py --workdir=runs/mp [--config.KEY=VALUE ...]
#
# DEVICES_PER_PROCESS (default 4) simulated CPU devices each; PORT (default 12355) for the
# coordinator. Process 0 prints to this terminal, process i > 0 to WORKDIR/process_<i>.log (a
# gs:// workdir: a local temporary folder it names). The flags and variables are checked by the
# launchers' shared rules (launch/_rules.sh).
# Exits non-zero when any process fails. Nothing here sets a hyperparameter.
set -euo pipefail
# shellcheck source=launch/_rules.sh
source "$(dirname "$0")/_rules.sh"
if [[ $# -lt 2 || ! "$1" =~ ^[0-9]+$ ]]; then
  echo "usage: $0 N --config=... --workdir=... [train flags]" >&2
  exit 2
fi
n=$((10#$1))
shift
# Checked before anything starts: N = 0 would start nothing and exit 0, as if a run had finished.
if ((n < 1)); then
  echo "error: N=$n processes: give 1 or more" >&2
  exit 2
fi
devices=$(whole_number DEVICES_PER_PROCESS 4 1 100000 "a whole number >= 1")
port=$(whole_number PORT 12355 1 65535 "a port number from 1 to 65535")
workdir=$(flag_value workdir "$@")
check_workdir "$workdir"
# Process i > 0 logs into the workdir, or for a gs:// one (which has no local folder: mkdir made
# a ./gs:/... tree) into a local temporary folder named here.
logs=$workdir
if is_remote "$workdir"; then
  logs=$(mktemp -d -t electra_jax-processes-XXXXXX)
  echo "processes 1 to $((n - 1)) log into $logs" >&2
else
  mkdir -p "$workdir"
fi
export XLA_FLAGS="--xla_force_host_platform_device_count=$devices ${XLA_FLAGS:-}"
pids=()
for ((i = 0; i < n; i++)); do
  cmd=(python -m electra_jax.train "$@" --coordinator_address="127.0.0.1:$port"
       --num_processes="$n" --process_id="$i")
  if ((i == 0)); then
    "${cmd[@]}" &
  else
    "${cmd[@]}" >"$logs/process_$i.log" 2>&1 &
  fi
  pids+=($!)
done
# SIGTERM / SIGINT here reach every process, which then save and stop at the same step.
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM INT
status=0
for i in "${!pids[@]}"; do
  code=0
  wait "${pids[$i]}" || code=$?
  if ((code != 0)); then
    where="above"
    ((i > 0)) && where="in $logs/process_$i.log"
    echo "process $i exited with code $code (its output is $where)" >&2
    status=$code
  fi
done
exit $status
