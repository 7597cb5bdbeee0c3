"""Shared fixtures: tiny configs and specs that compile in seconds on 2 CPU cores."""

import os
import pathlib
import runpy

import jax
import pytest

# Compile time dominates these tiny models; XLA's heavy passes buy nothing here.
jax.config.update("jax_disable_most_optimizations", True)

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


def load_config(name: str):
    return runpy.run_path(str(ROOT / "configs" / f"{name}.py"))["get_config"]()


def micro_config():
    """The tiny config shrunk further: 2 layers, 64 wide, 32 tokens, vocab 300."""
    config = load_config("tiny")
    config.data.vocab_size = 300
    config.data.seq_length = 32
    config.data.tokenizer_sample_sentences = 20_000
    config.model.hidden_size = 64
    config.model.num_layers = 2
    config.model.num_heads = 2
    config.model.intermediate_size = 128
    config.model.embedding_size = 32
    config.train.batch_size = 8
    config.train.num_steps = 6
    config.train.warmup_steps = 2
    config.checkpoint.every_steps = 3
    config.log.every_steps = 1
    return config


@pytest.fixture
def micro():
    return micro_config()


def subprocess_env(devices: int | None = None) -> dict:
    env = dict(os.environ)
    # Like this process (above): CLI runs in tests compile in seconds and compute the same
    # numbers as in-process runs.
    env.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env
