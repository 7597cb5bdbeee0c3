# The rules every launcher holds (sourced by slurm.sbatch, tpu_vm.sh and local_multiprocess.sh),
# the same as the Python commands': a flag is read in both of absl's forms (--name=VALUE and
# --name VALUE) and given once, a switch is 0 or 1, a number is a whole number in its range, a
# workdir is a local path or gs://BUCKET[/PATH] with a bucket name Cloud Storage accepts, and
# jax's compilation cache goes beside the workdir only where there is a folder beside it. Each
# refusal is one `error:` line naming the flag or variable and what to give, exit code 2, before
# anything starts (tests/test_launch_rules.py).

launcher_fail() {
  echo "error: $*" >&2
  exit 2
}

# flag_value NAME ARGS...: the value of --NAME=VALUE or --NAME VALUE in ARGS ('' when absent);
# refused when given twice (absl would silently take the later) or without a value.
flag_value() {
  local name=$1 found="" seen=0
  shift
  while (($#)); do
    case $1 in
      --"$name"=*) found=${1#--"$name"=} seen=$((seen + 1)) ;;
      --"$name")
        (($# >= 2)) || launcher_fail "--$name needs a value (--$name=VALUE)"
        found=$2 seen=$((seen + 1))
        shift
        ;;
    esac
    shift
  done
  ((seen <= 1)) || launcher_fail "--$name is given $seen times; give it once"
  printf '%s' "$found"
}

# switch NAME: the environment switch NAME as 0 or 1 (unset or empty: 0). Anything else
# (SPOT=yes, SPOT=true) is refused rather than read as off.
switch() {
  local value=${!1:-0}
  [[ $value == 0 || $value == 1 ]] || launcher_fail "$1=$value: give $1=1 (on) or $1=0 (off)"
  printf '%s' "$value"
}

# whole_number NAME DEFAULT MIN MAX [WHAT]: the environment variable NAME (unset or empty:
# DEFAULT) as a whole number from MIN to MAX, in decimal (WHAT: what to say it must be).
whole_number() {
  local name=$1 value=${!1:-$2} min=$3 max=$4
  local what=${5:-a whole number from $min to $max}
  if [[ ! $value =~ ^[0-9]{1,15}$ ]] || ((10#$value < min || 10#$value > max)); then
    launcher_fail "$name=$value must be $what"
  fi
  printf '%s' "$((10#$value))"
}

# check_workdir WORKDIR: a local path, or gs://BUCKET[/PATH] whose bucket name Cloud Storage
# accepts (lower-case letters, digits, '-', '_' and '.', starting and ending with a letter or
# digit); another URI is refused, as the commands refuse it.
check_workdir() {
  local workdir=$1
  [[ -n $workdir ]] || launcher_fail "--workdir=... is required"
  if [[ $workdir == *://* ]]; then
    [[ ${workdir,,} == gs://* ]] || launcher_fail "--workdir=$workdir: a workdir is a local path or gs://BUCKET/PATH"
    local bucket=${workdir#*://}
    bucket=${bucket%%/*}
    if [[ ! $bucket =~ ^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$ ]]; then
      launcher_fail "--workdir=$workdir: '$bucket' is not a Cloud Storage bucket name (lower-case letters, digits, '-', '_' and '.', starting and ending with a letter or digit: capitals are not allowed)"
    fi
  fi
}

# is_remote WORKDIR: whether it is a bucket path (written through the network, no local folder).
is_remote() {
  [[ $1 == *://* ]]
}

# cache_beside WORKDIR: jax's compilation cache shared by the runs beside WORKDIR: its parent's
# jax_compilation_cache; '' for a workdir that is a whole bucket (gs://BUCKET has no folder beside
# it: dirname made the local path gs:/jax_compilation_cache), where the run keeps its own cache.
cache_beside() {
  local workdir=${1%/}
  if is_remote "$workdir"; then
    local rest=${workdir#*://}
    [[ $rest == */* ]] || return 0
    printf '%s/jax_compilation_cache' "${workdir%/*}"
  else
    printf '%s/jax_compilation_cache' "$(dirname "$workdir")"
  fi
}
