# The CUDA 12 image: electra_jax with jax's CUDA 12 plugin and NVIDIA's CUDA, cuDNN and NCCL
# wheels, every Python package at the version in constraints-cuda12.txt. The host's NVIDIA driver
# is the only thing the wheels need from outside (GKE's GPU nodes mount it), so the base is plain
# Python, not a CUDA image. Built from the repository's root, which is the build context:
#
#   docker build -f launch/docker/cuda12.Dockerfile -t us-docker.pkg.dev/PROJECT/electra/electra_jax:0.1.0-cuda12 .
#
# launch/k8s/gpu_jobset.yaml runs this tag (tests/test_docker.py keeps the two and setup.py's
# version in step); docs/scaling.md says how to push it. Python 3.11: the version the locks
# were resolved for (launch/docker/lock.py).
FROM python:3.11-slim-bookworm

# The train command's --config=configs/... paths are relative: configs/ sits in the working
# directory beside the installed package.
WORKDIR /electra_jax
COPY . .
# jax[k8s] (the kubernetes client): jax's Kubernetes cluster detection asks the API server for
# the pod's Job, which is how the GPU JobSet's pods find each other. Not editable: the image runs
# the installed copy. No pip cache: it would only grow the image. The lock pins what is installed;
# setuptools for building the project itself comes into pip's isolated build environment
# (pyproject.toml's build-system) unpinned and leaves nothing in the image.
RUN pip install --no-cache-dir -c constraints-cuda12.txt '.[cuda12,gcs,parquet,wandb]' 'jax[k8s]'
