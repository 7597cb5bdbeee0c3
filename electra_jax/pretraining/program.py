"""What a run's config compiles: the mesh checked against the batch, the model, optimizer and
schedule, the state's layout on the mesh, and the jitted train step (one step, and K per call).

The runner (runner.py), the dry run (dry_run.py), the benchmarks and the tests all build their step
here, so that what is measured is what trains.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np

from electra_jax import validate
from electra_jax.config.schema import flatten
from electra_jax.errors import ConfigError
from electra_jax.model import sharding
from electra_jax.model.networks import (
    PALLAS_GENERATIONS,
    Electra,
    ElectraSpec,
    abstract_params,
    check_attention_platform,
    resolved_attention,
    spec_from_config,
)
from electra_jax.model.optim import make_optimizer
from electra_jax.objectives import registry
from electra_jax.objectives.core import num_mask_slots
from electra_jax.pretraining import fit, metrics, remat_auto, topology
from electra_jax.pretraining.optimizer_step import (
    DEFAULT_SPECIAL,
    SpecialTokens,
    abstract_state,
    guarded_train_step,
    init_state,
    multi_step,
)


def build(config: ml_collections.ConfigDict, vocab_size: int, mesh=None):
    """The model, optimizer, schedule and mask-slot count a config describes (for `mesh`, when
    given: FSDP pins activations to the batch split).

    train.remat='auto' builds the model without remat: its shapes, parameters and counts are
    those of every policy. The step is set up for a chosen policy only (setup_step resolves
    'auto' first)."""
    remat = config.train.remat
    spec = spec_from_config(
        config.model,
        config.generator,
        vocab_size,
        "none" if remat == remat_auto.AUTO else remat,
        **registry.model_heads(config.objective),
    )
    if mesh is not None:
        spec = dataclasses.replace(spec, platform=mesh.devices.flat[0].platform)
        if spec.attention == "auto" and _generation(mesh) not in PALLAS_GENERATIONS:
            spec = dataclasses.replace(spec, attention="einsum")  # a chip the kernel skips
    attention = resolved_attention(
        spec.attention, spec.platform, config.data.seq_length, spec.discriminator.hidden_size
    )
    if mesh is not None and mesh.size > 1 and attention == "pallas":
        spec = dataclasses.replace(spec, batch_sharding=sharding.batch_sharding(mesh))
    if mesh is not None and mesh.shape["fsdp"] > 1:
        spec = dataclasses.replace(spec, activation_sharding=sharding.batch_sharding(mesh))
    model = Electra(spec)
    tx, schedule = make_optimizer(config.train)
    num_slots = num_mask_slots(config.data.seq_length, config.objective.mask_prob)
    return spec, model, tx, schedule, num_slots


def rtd_prior_bias(config) -> float:
    """The replaced-token head's starting bias: with train.rtd_prior_init, the logit of the
    share of tokens a fresh generator replaces (about objective.mask_prob: its near-uniform
    samples are almost never the original), so that the head starts calibrated and the
    discriminator's first updates need not shift every token's state to lower its logit; else 0,
    as the original."""
    if not config.train.rtd_prior_init:
        return 0.0
    p = config.objective.mask_prob
    return float(np.log(p / (1.0 - p)))


@dataclasses.dataclass(frozen=True)
class StepSetup:
    """What a run compiles: the model's spec, how to make the state, and the jitted step."""

    spec: ElectraSpec
    num_slots: int
    make_state: Callable  # () -> TrainState, for jax.jit(..., out_shardings=state_sharding)
    abstract_state: Any  # make_state()'s shapes (optimizer_step.abstract_state)
    state_sharding: Any
    step_fn: Callable  # jitted (state, global batch) -> (state, metrics); the state is donated
    # jitted (state, [K, B, L] batches) -> (state, [K] metrics): K = train.steps_per_call steps
    # in one call (train_step.multi_step); None when K = 1
    multi_step_fn: Callable | None = None
    # jitted () -> a fresh state laid out as state_sharding (init_on_mesh)
    init_fn: Callable | None = None
    # What the runner compiled of this setup, by program ({name: executable}): another run of
    # the same setup in this process uses them as they are.
    compiled: dict = dataclasses.field(default_factory=dict, compare=False)


# The setups this process made, newest last, by what they were made from (`_setup_key`): a run
# that asks for the step of a config this process has already set up on the same mesh (the
# Python API's second run, a sweep's repeated settings, a test's rerun) gets the same jitted
# functions and compiled programs, instead of tracing its programs again and compiling them or
# loading them from the compilation cache anew. A few are kept: each holds its executables.
_SETUPS: collections.OrderedDict[tuple, StepSetup] = collections.OrderedDict()
_SETUPS_KEPT = 4


# Settings no program of a setup reads (sections, and keys as the schema names them), so that runs
# differing only there share one: how often the runner logs, checkpoints and profiles (the host
# loop's business, runner.py), where compiled programs are cached and what an export writes;
# where the data, the tokenizer and the first weights come from and where prepared data is kept
# (what they hold reaches the setup as its vocabulary, special ids and unigram table, and the
# state as its values).
_NOT_COMPILED = (
    *("log", "checkpoint", "compile", "export"),
    *("data.cache_dir", "data.source", "data.tfds_data_dir", "data.tokenizer", "train.init_from"),
)


def _setup_key(config, vocab_size: int, mesh, special, unigram_cdf) -> tuple:
    """What setup_step's result depends on: every setting but _NOT_COMPILED (the programs read
    many), the vocabulary, the mesh (its devices and axes), the special ids and the unigram
    table."""
    table = None
    if unigram_cdf is not None:
        table = hashlib.sha256(np.ascontiguousarray(unigram_cdf, np.float32).tobytes()).digest()
    read = {
        name: value
        for name, value in flatten(config.to_dict()).items()
        if name not in _NOT_COMPILED and name.split(".")[0] not in _NOT_COMPILED
    }
    settings = json.dumps(read, sort_keys=True, default=repr)
    return settings, vocab_size, mesh, tuple(special), table


def setup_step(
    config: ml_collections.ConfigDict,
    vocab_size: int,
    mesh,
    special: SpecialTokens = DEFAULT_SPECIAL,
    unigram_cdf=None,
) -> StepSetup:
    """The model, state layout and compiled-on-first-use train step a config describes
    (`special`: the tokenizer's [PAD], [CLS], [SEP], [MASK] ids; `unigram_cdf`: float32 [V],
    the corpus's cumulative unigram distribution, which objective.unigram_share > 0 needs).
    The same arguments give the same setup, its programs compiled once per process."""
    if unigram_cdf is None and config.objective.unigram_share > 0:
        raise ValueError("objective.unigram_share > 0: give setup_step the corpus's unigram_cdf")
    if config.train.remat == remat_auto.AUTO:
        # The setup of the policy remat_auto chooses for these devices, its program compiled.
        choice = resolve_remat(config, vocab_size, mesh, special, unigram_cdf)
        metrics.log(choice.line)
        config = remat_auto.with_policy(config, choice.policy)
    key = _setup_key(config, vocab_size, mesh, special, unigram_cdf)
    setup = _SETUPS.pop(key, None) or _new_setup(config, vocab_size, mesh, special, unigram_cdf)
    _SETUPS[key] = setup
    while len(_SETUPS) > _SETUPS_KEPT:
        _SETUPS.popitem(last=False)
    return setup


def _new_setup(config, vocab_size: int, mesh, special, unigram_cdf) -> StepSetup:
    """setup_step's work: the setup, traced and compiled at first use."""
    spec, model, tx, schedule, num_slots = build(config, vocab_size, mesh)
    make_state = functools.partial(
        init_state, model, tx, config.seed, rtd_bias=rtd_prior_bias(config)
    )
    shapes, logical_axes = abstract_params(model)
    abstract = abstract_state(shapes, tx)
    params_sharding = sharding.param_shardings(logical_axes, abstract.params, mesh)
    state_sharding = sharding.state_shardings(abstract, params_sharding, mesh)
    one_step = functools.partial(
        guarded_train_step,
        nan_policy=config.train.nan_policy,
        debug_nan_at_step=config.train.debug_nan_at_step,
        model=model,
        tx=tx,
        schedule=schedule,
        objective_cfg=config.objective,
        num_slots=num_slots,
        grad_accum_steps=config.train.grad_accum_steps,
        special=special,
        unigram_cdf=(
            np.asarray(unigram_cdf, np.float32) if config.objective.unigram_share > 0 else None
        ),
    )

    def jitted(fn, batch_sharding):
        return jax.jit(
            fn,
            in_shardings=(state_sharding, batch_sharding),
            out_shardings=(state_sharding, sharding.replicated(mesh)),
            donate_argnums=(0,),
        )

    step_fn = jitted(one_step, sharding.batch_sharding(mesh))
    multi_step_fn = None
    if config.train.steps_per_call > 1:
        multi_step_fn = jitted(
            functools.partial(multi_step, step_fn=one_step), sharding.stacked_batch_sharding(mesh)
        )
    init_fn = jax.jit(make_state, out_shardings=state_sharding)
    return StepSetup(
        spec, num_slots, make_state, abstract, state_sharding, step_fn, multi_step_fn, init_fn
    )


def abstract_arguments(
    setup: StepSetup, config: ml_collections.ConfigDict, mesh, steps: int | None = None
):
    """The program a run of `config` calls most, with abstract arguments (nothing allocated):
    (its name in StepSetup.compiled, the jitted function, the state's and one call's batches'
    shapes with their shardings). The program is `steps` (by default train.steps_per_call)
    steps in one call (multi_step_fn, batches [K, B, L]) when that is above 1, else one step
    (step_fn, [B, L])."""
    steps = config.train.steps_per_call if steps is None else steps
    state = jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
        setup.abstract_state,
        setup.state_sharding,
    )
    shape = (config.train.batch_size, config.data.seq_length)
    if steps > 1:
        name, fn, layout = "multi_step", setup.multi_step_fn, sharding.stacked_batch_sharding(mesh)
        shape = (steps, *shape)
    else:
        name, fn, layout = "step", setup.step_fn, sharding.batch_sharding(mesh)
    row = jax.ShapeDtypeStruct(shape, jax.numpy.int32, sharding=layout)
    return name, fn, state, {"input_ids": row, "segment_ids": row, "input_mask": row}


def init_on_mesh(setup: StepSetup):
    """Fresh parameters and optimizer state, laid out as the step expects."""
    return setup.init_fn()


def _generation(mesh) -> str | None:
    """The TPU generation of `mesh`'s devices (topology.GENERATIONS' name), None off TPUs."""
    device = mesh.devices.flat[0]
    if device.platform != "tpu":
        return None
    generation = topology.generation_for_kind(device.device_kind)
    return generation.name if generation is not None else None


def checked_mesh(config: ml_collections.ConfigDict, process_count: int, devices=None):
    """The run's mesh over all devices (or `devices`: a slice's compile-only ones, from
    topology.py); ConfigError when it or the batch does not fit them, or model.attention cannot
    run on them."""
    try:
        mesh = sharding.make_mesh(config.mesh, devices)
    except ValueError as e:
        raise ConfigError(f"{e}; choose a mesh.fsdp that divides it") from e
    # Here, where the devices are first known (before the data is prepared), as well as where
    # the layer is traced (SelfAttention._pallas), which also covers callers without a mesh.
    check_attention_platform(
        config.model.attention, mesh.devices.flat[0].platform, _generation(mesh)
    )
    validate.check_batch(
        config.train.batch_size,
        sharding.data_parallel_size(mesh),
        process_count,
        config.train.grad_accum_steps,
    )
    eval_batch = eval_batch_size(config)
    if eval_every(config) and eval_batch != config.train.batch_size:
        try:
            validate.check_batch(eval_batch, sharding.data_parallel_size(mesh), process_count)
        except ConfigError as e:
            message = str(e).replace("train.batch_size", "eval.batch_size")
            raise ConfigError(message) from None
    return mesh


def eval_every(config) -> int:
    """eval.every_steps (0 for configs without an eval section, or without held-out rows)."""
    if not config.data.heldout_examples:
        return 0
    return config.eval.every_steps


def eval_batch_size(config) -> int:
    return config.eval.batch_size or config.train.batch_size


# Choices made in this process, newest last, by the auto config's setup key and the limit: a
# second run of the same config (the Python API, a test) takes it without compiling the
# candidates again. A few are kept, as program.py keeps setups: each holds an executable.
_CHOICES: collections.OrderedDict[tuple, remat_auto.Choice] = collections.OrderedDict()
_CHOICES_KEPT = 4


def resolve_remat(
    config,
    vocab_size: int,
    mesh,
    special=None,
    unigram_cdf=None,
    limit: tuple[int | None, str] | None = None,
) -> remat_auto.Choice:
    """Chooses train.remat for 'auto' on `mesh`'s devices: compiles the program the run calls
    most (abstract_arguments) under each policy of remat_auto.ORDER until one fits
    (remat_auto.choose), and leaves the chosen one's compiled program in its setup (setup_step
    of the config with that policy), for the run to call. `limit`: (bytes per device, the
    devices in words) instead of remat_auto.device_memory's (a test's lowered budget). Where no
    limit is known, 'none' without a compile. Raises remat_auto.NothingFits."""
    special = DEFAULT_SPECIAL if special is None else special
    devices = list(mesh.devices.flat)
    limit_bytes, where = limit if limit is not None else remat_auto.device_memory(devices)
    if limit_bytes is None:
        return remat_auto.Choice(
            "none",
            f"train.remat=auto: 'none' for {where}: no memory limit is known for "
            f"{devices[0].platform} devices, so nothing was compiled to choose",
        )
    key = (_setup_key(config, vocab_size, mesh, special, unigram_cdf), limit_bytes)
    if key in _CHOICES:
        _CHOICES.move_to_end(key)
        return _CHOICES[key]

    compiles = []

    def measure(policy: str):
        cfg = remat_auto.with_policy(config, policy)
        setup = setup_step(cfg, vocab_size, mesh, special, unigram_cdf)
        name, fn, state, batch = abstract_arguments(setup, cfg, mesh)
        compiled = setup.compiled.get(name)  # compiled earlier in this process
        if compiled is not None:
            return fit.memory(compiled)["memory_per_device_bytes"], compiled
        compiles.append(policy)
        return fit.compile_need(fn, state, batch)

    t0 = time.time()
    choice = remat_auto.choose(
        measure, limit_bytes, where, fit.fix_hint(config, mesh), remat_auto.ORDER
    )
    seconds = time.time() - t0
    cfg = remat_auto.with_policy(config, choice.policy)
    setup = setup_step(cfg, vocab_size, mesh, special, unigram_cdf)
    name, *_ = abstract_arguments(setup, cfg, mesh)
    setup.compiled[name] = choice.compiled
    done = f"{len(compiles)} compile{'' if len(compiles) == 1 else 's'}, {seconds:.1f}s"
    choice = dataclasses.replace(choice, line=f"{choice.line} ({done})", seconds=seconds)
    _CHOICES[key] = choice
    while len(_CHOICES) > _CHOICES_KEPT:
        _CHOICES.popitem(last=False)
    return choice
