#!/usr/bin/env bash
# Downloads into .whl/ the wheels electra_jax needs that the H200 machine's image lacks, for its
# Python (3.12, x86-64 manylinux), at the versions installed here; benchmarks/gpu.sh installs
# them there first (pip --no-index --no-deps --target /tmp/site).
#
#   benchmarks/gpu_wheels.sh            # ml-collections, grain, array-record, portpicker
#   benchmarks/gpu_wheels.sh sentencepiece tensorflow-datasets   # more, by name
#
# The image has jax, flax, optax, orbax-checkpoint, absl-py, etils, sentencepiece, safetensors,
# tokenizers, tensorboard, PyYAML, cloudpickle, protobuf and psutil (the needs of these four);
# each wheel is fetched with --no-deps, so a package not listed here and missing there must be
# named. One version of each: a second one in .whl/ stops the whole install there.
set -euo pipefail
cd "$(dirname "$0")/.."
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(ml-collections grain array-record portpicker)
specs=()
for name in "${names[@]}"; do
  version=$(python3 -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' "$name" \
    2>/dev/null) || { echo "error: $name is not installed here; install it or name a version" >&2; exit 2; }
  specs+=("$name==$version")
  rm -f .whl/"$(echo "$name" | tr - _)"-*.whl .whl/"$name"-*.whl
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${specs[@]}"
ls -l .whl/*.whl
du -sh .whl
