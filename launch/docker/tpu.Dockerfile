# The TPU image: electra_jax with jax's TPU runtime (libtpu), every Python package at the version
# in constraints-tpu.txt. Built from the repository's root, which is the build context:
#
#   docker build -f launch/docker/tpu.Dockerfile -t us-docker.pkg.dev/PROJECT/electra/electra_jax:0.1.0-tpu .
#
# launch/k8s/tpu_jobset.yaml runs this tag (tests/test_docker.py keeps the two and setup.py's
# version in step); docs/scaling.md says how to push it. Python 3.11: the version the locks
# were resolved for (launch/docker/lock.py).
FROM python:3.11-slim-bookworm

# The train command's --config=configs/... paths are relative: configs/ sits in the working
# directory beside the installed package.
WORKDIR /electra_jax
COPY . .
# Not editable: the image runs the installed copy. No pip cache: it would only grow the image.
# The lock pins what is installed; setuptools for building the project itself comes into
# pip's isolated build environment (pyproject.toml's build-system) unpinned and leaves nothing
# in the image.
RUN pip install --no-cache-dir -c constraints-tpu.txt '.[tpu,gcs,parquet,wandb]'
