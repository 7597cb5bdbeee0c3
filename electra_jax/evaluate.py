"""`python -m electra_jax.evaluate`: held-out evaluation of a pre-training run after the fact.

    python -m electra_jax.evaluate --workdir=runs/tiny [--steps=200,400]

Evaluates the checkpoints a workdir keeps (all of them, or `--steps`) as the run evaluates during
training (pretraining/scoring.py) and writes the rows, the same keys, to WORKDIR/eval.jsonl
(rewritten whole, atomically; rows of steps not evaluated again are kept); `read_rows(workdir)`
joins both sources. A run started before the held-out slice existed trained on every row: its
evaluation reads `--heldout_examples` rows it has seen, says so in a warning line, and marks its
rows `eval/trained_on: 1`.
"""

from __future__ import annotations

import json

import ml_collections
from absl import app, flags

from electra_jax.cli import each_once, fail, no_answer_ends, parse_flags, quiet_logs
from electra_jax.data.tokenizer import load_saved
from electra_jax.errors import ConfigError, DataError, PretrainedError
from electra_jax.run import workdir as workdir_lib
from electra_jax.store import checkpoint_steps, filenames, jsonio, paths

# jax and the modules below import it in the functions that use them, not here: a refusal of a
# bad flag by `python -m electra_jax.evaluate` need not wait seconds for them.


def read_rows(workdir: str) -> list[dict]:
    """pretraining/scoring.py's `read_rows`: a run's held-out readings by step, those its
    training logged and those this command wrote."""
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    from electra_jax.pretraining import scoring

    return scoring.read_rows(workdir)


def evaluate_workdir(
    workdir: str, steps: list[int] | None = None, heldout_examples: int = 256
) -> list[dict]:
    """Evaluates the checkpoints a pre-training workdir keeps (or those of `steps`) on its
    held-out slice; writes their rows to WORKDIR/eval.jsonl and returns them.

    heldout_examples: for a run whose config.json predates data.heldout_examples (it trained on
    every row), how many of its rows to read, marked `eval/trained_on: 1`.
    Raises PretrainedError (a workdir that is not a run's, a missing step) or ConfigError.
    """
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    import jax
    import orbax.checkpoint as ocp

    from electra_jax import pretrained
    from electra_jax.model import sharding
    from electra_jax.model.networks import Electra
    from electra_jax.objectives.core import num_mask_slots
    from electra_jax.pretraining import metrics, resume
    from electra_jax.pretraining.optimizer_step import special_tokens_of
    from electra_jax.pretraining.scoring import EVAL_FILE, PREFIX, build

    kind = pretrained.folder_kind(workdir)
    if kind == "fine-tuning":
        raise pretrained.PretrainedError(
            f"--workdir {workdir} is a fine-tuning workdir, whose dev results are its "
            "eval_results.json; python -m electra_jax.evaluate takes a pre-training workdir"
        )
    if kind == "hf":
        raise pretrained.PretrainedError(
            f"--workdir {workdir} is an export (transformers files); python -m "
            "electra_jax.evaluate takes a pre-training workdir, such as the one exported"
        )
    config = ml_collections.ConfigDict(pretrained.read_run_config(workdir))
    trained_on = not config.data.heldout_examples
    if trained_on:
        metrics.log(
            f"warning: {workdir} was trained on every row (its config.json predates "
            f"data.heldout_examples); reading {heldout_examples} of the rows it trained on"
        )
        with config.unlocked():
            config.data.heldout_examples = heldout_examples
    with workdir_lib.claimed(workdir, workdir_lib.PRETRAIN, command="electra_jax.evaluate"):
        tokenizer = load_saved(paths.join(workdir, filenames.TOKENIZER_DIR))
        # The held-out rows are tokenized with it: it must be the one the checkpoints learned.
        pretrained.check_recorded_tokenizer(workdir, tokenizer)
        # A corpus gone since the run: the shards its data record proves stand in for it.
        prepared = resume.prepared_data(config, workdir, tokenizer, log=metrics.log)
        mesh = sharding.make_mesh(ml_collections.ConfigDict({"fsdp": 1}))
        where = paths.join(workdir, filenames.CONFIG_FILE)
        spec = pretrained.spec_from_run_config(config.to_dict(), tokenizer.vocab_size, where)
        model = Electra(spec)
        num_slots = num_mask_slots(config.data.seq_length, config.objective.mask_prob)
        abstract = jax.eval_shape(lambda: _init_params(model))
        params_sharding = jax.tree_util.tree_map(lambda _: sharding.replicated(mesh), abstract)
        batch_size = config.eval.batch_size or config.train.batch_size
        evaluator = build(
            model=model,
            num_slots=num_slots,
            objective_cfg=config.objective,
            abstract_params=abstract,
            params_sharding=params_sharding,
            mesh=mesh,
            prepared=prepared,
            heldout_examples=config.data.heldout_examples,
            batch_size=batch_size,
            every=0,
            special=special_tokens_of(tokenizer),
        )
        if steps is None:
            manager = ocp.CheckpointManager(
                checkpoint_steps.checkpoint_dir(workdir),
                options=ocp.CheckpointManagerOptions(read_only=True, create=False),
            )
            steps = sorted(manager.all_steps())
            manager.close()
        rows = []
        for step in steps:
            params, step = pretrained.restore_params(workdir, spec, step)
            row = {"step": step, **evaluator.run(jax.device_put(params, params_sharding))}
            if trained_on:
                row[PREFIX + "trained_on"] = 1.0
            rows.append(row)
            metrics.log(progress(step, row))
        kept = [r for r in metrics.read_rows(paths.join(workdir, EVAL_FILE))]
        done = {r["step"] for r in rows}
        merged = sorted([r for r in kept if r["step"] not in done] + rows, key=lambda r: r["step"])
        jsonio.write_jsonl(paths.join(workdir, EVAL_FILE), merged)
    return rows


def _init_params(model):
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    import jax

    from electra_jax.model.networks import init_params

    return init_params(model, jax.random.PRNGKey(0))


def progress(step: int, row: dict) -> str:
    """One line of held-out readings: AUC (frequent pieces, unigram replacements), loss
    against the prior, cosine."""
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    from electra_jax.pretraining.scoring import PREFIX

    get = lambda k: row.get(PREFIX + k)
    parts = [f"held-out at step {step}:"]
    if get("disc_auc") is not None:
        parts.append(f"auc {get('disc_auc'):.3f}")
    if get("disc_auc_frequent") is not None:
        parts.append(f"(frequent {get('disc_auc_frequent'):.3f})")
    if get("disc_auc_unigram") is not None:
        parts.append(f"unigram auc {get('disc_auc_unigram'):.3f}")
    if get("disc_loss") is not None:
        parts.append(f"disc {get('disc_loss'):.4f} vs prior {get('disc_prior_entropy'):.4f}")
    if get("mlm_accuracy") is not None:
        parts.append(f"mlm acc {get('mlm_accuracy'):.3f}")
    if get("gen_accuracy") is not None:
        parts.append(f"gen acc {get('gen_accuracy'):.3f}")
    parts.append(f"cosine {get('collapse_cosine'):.3f}")
    return "  ".join(parts)


# ----------------------------------------------------------------------------------- command


def _define_flags():
    flags.DEFINE_string("workdir", None, "The pre-training workdir whose checkpoints to evaluate.")
    flags.DEFINE_list("steps", None, "Checkpoint steps to evaluate (default: every one kept).")
    flags.DEFINE_integer(
        "heldout_examples",
        256,
        "Rows to read for a run that predates data.heldout_examples (it trained on all of them).",
    )
    flags.DEFINE_bool("verbose", False, "Show full tracebacks on errors.")


def main(argv) -> None:
    values = flags.FLAGS
    if not values.verbose:
        quiet_logs()
    if len(argv) > 1:
        fail(f"unexpected arguments {argv[1:]}; use --workdir=... [--steps=...]")
    if not values.workdir:
        fail("--workdir is required: the pre-training run to evaluate, e.g. --workdir=runs/tiny")
    with no_answer_ends(values.verbose):  # a gs:// workdir that stopped answering
        if not paths.isdir(values.workdir):
            what = "is a file, not a workdir" if paths.exists(values.workdir) else "does not exist"
            fail(f"--workdir {values.workdir} {what}; give a pre-training workdir")
    try:
        steps = None if values.steps is None else [int(s) for s in values.steps]
    except ValueError:
        fail(f"--steps={','.join(values.steps)} must be checkpoint steps, e.g. --steps=200,400")
    if steps is not None:
        each_once("--steps", values.steps, key=int)  # 3 and 03 are one checkpoint
    if values.heldout_examples < 1:
        fail(f"--heldout_examples={values.heldout_examples} must be >= 1")
    try:
        with no_answer_ends(values.verbose):
            rows = evaluate_workdir(values.workdir, steps, values.heldout_examples)
    except (PretrainedError, ConfigError, DataError, ValueError) as e:
        if values.verbose:
            raise
        fail(" ".join(str(e).split()))
    print(json.dumps({"workdir": values.workdir, "rows": rows}))


def cli() -> None:
    _define_flags()
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    cli()
