"""The export command: a run as Hugging Face transformers models.

    python -m electra_jax.export --workdir=runs/tiny --out=runs/tiny/hf
    python -m electra_jax.export --workdir=runs/tiny-sst2 --out=runs/tiny-sst2/hf
    python -m electra_jax.export --workdir=runs/small --push_to_hub=NAMESPACE/electra-small

A pre-training workdir becomes OUT/discriminator (ElectraForPreTraining), OUT/generator
(ElectraForMaskedLM), OUT/README.md (the model card, hf/card.py) and OUT/export.json from its
newest checkpoint. A fine-tuning workdir
becomes one model in OUT: ElectraForSequenceClassification (GLUE; config with id2label and
label2id, problem_type 'regression' for STS-B) or ElectraForQuestionAnswering (SQuAD 1.1 with
the independent head; see hf/heads.py for what maps exactly and what is refused), with its
tokenizer files, README.md (the model card, hf/card.py) and export.json. See `electra_jax.hf.write`
for how a previous export is replaced. `--push_to_hub=REPO` then uploads the export to that
Hugging Face Hub model repository (hf/hub.py; the card is titled REPO). Bad input is one `error:`
line, exit code 2, and nothing written.
"""

from __future__ import annotations

import functools
import os
import sys

from absl import app, flags

from electra_jax.cli import fail, no_answer_ends, parse_flags, quiet_logs
from electra_jax.errors import ConfigError, PretrainedError
from electra_jax.hf import card, hub, task_heads
from electra_jax.hf.previous import check_out
from electra_jax.hf.tokenizer_files import write_tokenizer_files
from electra_jax.run import workdir as workdir_lib
from electra_jax.store import filenames, paths
from electra_jax.store.jsonio import write_json


def export(
    workdir: str,
    out: str,
    push_to_hub: str | None = None,
    hub_private: bool = False,
    hub_timeout_seconds: float | None = None,
    card_details: bool = False,
) -> dict:
    """A workdir's newest checkpoint (or a fine-tuning's saved model) -> OUT, then to the Hub
    repository `push_to_hub` when given (created `hub_private` if missing); returns the
    manifest (with "hub_url" after an upload)."""
    # The checks of --out and --workdir first, without jax and flax (seconds to import), which
    # the writing below and the functions after this one import.
    if paths.is_remote(out):
        # The export's files are written with its own checks against links and foreign files,
        # which need a filesystem; a bucket gets the finished folder by a copy.
        name = paths.absolute(workdir).rsplit("/", 1)[-1]
        raise PretrainedError(
            f"--out {out} is a URI (a gs:// --workdir's default --out is in its bucket); give a "
            f"local folder (e.g. --out=runs/{name}-hf) and copy it to the bucket afterwards "
            "(gcloud storage cp -r OUT gs://...)"
        )
    try:  # never into a folder a run manages: its next resume would take the export for its own
        workdir_lib.refuse_managed(out, "--out")
    except ConfigError as e:
        raise PretrainedError(str(e)) from None
    check_out(os.path.abspath(out))  # before the restore, so a bad --out fails at once
    from electra_jax.hf.previous import listed_not_ours

    foreign = listed_not_ours(os.path.abspath(out))
    if foreign:  # a folder is ours only for the files we wrote: say what happens to these
        print(
            f"note: {paths.join(out, filenames.EXPORT_MANIFEST)} lists {', '.join(foreign[:5])}"
            f"{' ...' if len(foreign) > 5 else ''}, which no export writes: left as "
            f"{'they are' if len(foreign) > 1 else 'it is'}, and not listed by this export",
            file=sys.stderr,
        )
    if push_to_hub:
        hub.check(push_to_hub)  # and a bad repository name or a missing login
    from electra_jax.store import checkpoint_steps

    # WORKDIR@STEP: that checkpoint, as `load` and `evaluate` take it.
    workdir, step = checkpoint_steps.split_step(workdir)
    if not paths.isdir(workdir):
        what = "is a file, not a workdir" if paths.exists(workdir) else "does not exist"
        raise PretrainedError(
            f"--workdir {workdir} {what}; give a pre-training or fine-tuning workdir"
        )
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    from electra_jax.finetune.predictor import is_finetuned
    from electra_jax.hf.write import write_export
    from electra_jax.pretrained import load_workdir

    if is_finetuned(workdir):
        if step is not None:
            raise PretrainedError(
                f"--workdir {workdir}@{step}: @STEP picks a checkpoint of a pre-training "
                f"workdir, and {workdir} is a fine-tuning workdir, which keeps one model: give "
                f"--workdir={workdir}"
            )
        manifest = export_finetuned(workdir, out, name=push_to_hub)
    else:
        pre = load_workdir(workdir, step)
        readme = pretraining_readme(workdir, pre, push_to_hub, details=card_details)
        manifest = write_export(pre, out, readme=readme)
    if push_to_hub:
        timeout = hub_timeout_seconds or hub.DEFAULT_TIMEOUT_SECONDS
        manifest["hub_url"] = hub.push(out, push_to_hub, manifest, hub_private, timeout)
    return manifest


def pretraining_readme(workdir: str, pre, name: str | None = None, details: bool = False) -> str:
    """The model card (hf/card.py) of a pre-training workdir's export at `pre`'s step, from the
    workdir's records: what a fine-tuning records of it (corpus, steps, counted FLOPs, the
    metrics row), its held-out readings up to that step, config.json (upgraded: read_run_config),
    and with `details` its command lines and paths. `name`: the card's title and the name its
    example loads (default: the workdir's folder name)."""
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    from electra_jax.finetune import saved
    from electra_jax.pretrained import read_run_config
    from electra_jax.pretraining import metrics, scoring

    heldout = [r for r in scoring.read_rows(workdir) if r["step"] <= pre.step]
    commands = metrics.read_rows(paths.join(workdir, workdir_lib.COMMANDS_FILE))
    return card.pretraining_card(
        name=name or card.card_name(workdir),
        record=saved.pretraining_record(workdir, pre),
        config=read_run_config(workdir),
        heldout=heldout[-1] if heldout else None,
        commands=[r for r in commands if isinstance(r, dict) and r.get("step", 0) <= pre.step],
        details=details,
    )


def export_finetuned(workdir: str, out: str, name: str | None = None) -> dict:
    """A fine-tuning workdir's model -> OUT: config.json, model.safetensors, tokenizer files,
    README.md (titled `name`, default the workdir's folder name), export.json. Everything is
    read and checked before anything is written.

    Raises:
      PretrainedError: no saved weights or results, a task or label set this version does not
        have, a head transformers cannot represent (SQuAD's joint or answerability heads).
    """
    # safetensors: only on the path that uses it (an optional extra, or slow to import).
    import jax
    from safetensors.numpy import save_file

    from electra_jax.finetune import predictor, saved
    from electra_jax.finetune.glue import regression_targets
    from electra_jax.hf.electra_config import hf_config
    from electra_jax.hf.names import DISCRIMINATOR, WEIGHTS, encoder_to_hf
    from electra_jax.hf.write import write_folder

    config, record, family, task = predictor.read_run(workdir)
    spec = saved.spec_from_json(record.get("spec"), paths.join(workdir, saved.MODEL_FILE))
    network = family.network(config, task, spec)
    if family.name == "squad":
        refusal = task_heads.qa_refusal(config.joint_prediction, network.answerable)
        if refusal:
            raise PretrainedError(f"{workdir}: {record['task']} cannot be exported: {refusal}")
    abstract = jax.eval_shape(functools.partial(family.init_params, network), jax.random.PRNGKey(0))
    params = saved.load_weights(workdir, abstract)
    tokenizer = saved.load_tokenizer(workdir, record.get("tokenizer_fingerprint"))
    results = saved.read_json(
        paths.join(workdir, saved.RESULTS_FILE), "the run has not finished: rerun its command"
    )
    hf = hf_config(spec, DISCRIMINATOR, tokenizer.pad_id)
    hf["tie_word_embeddings"] = False
    tensors = encoder_to_hf(params, spec)
    if family.name == "glue":
        low, width = regression_targets(task, config.scale_regression_targets)
        tensors.update(
            task_heads.classifier_to_hf(
                params["classifier"], spec.discriminator.hidden_size, low, width
            )
        )
        names = list(task.labels) or ["score"]
        architecture, pipeline_tag = task_heads.SEQUENCE_CLASSIFICATION, "text-classification"
        hf.update(
            id2label={str(i): n for i, n in enumerate(names)},
            label2id={n: i for i, n in enumerate(names)},
            problem_type=record["problem_type"],
        )
        first = task.dev_splits[0]
        metrics = results["metrics"][first.name]
        dataset = card.glue_dataset(task.tfds_name, first.tfds_split)
        note = (
            "The head is the original ELECTRA's single linear layer on [CLS], written into "
            "transformers' dense + gelu + out_proj head so that it computes the same logits "
            "(gelu(y) - gelu(-y) = y; see electra_jax/hf/task_heads.py)."
            + (
                f" The logit is the score on the task's scale ({low:g} + {width:g} x the "
                "trained output)."
                if task.is_regression
                else ""
            )
        )
    else:
        tensors.update(task_heads.qa_to_hf(params))
        architecture, pipeline_tag = task_heads.QUESTION_ANSWERING, "question-answering"
        hf["num_labels"] = 2
        metrics = {k: results[k] for k in ("exact_match", "f1")}
        dataset = card.squad_dataset(task)
        note = (
            "The head is BERT's independent start and end layers "
            "(config.joint_prediction=false), which transformers' qa_outputs holds exactly; "
            "the pipeline's decoding (its n-best, its length limit) is transformers' own."
        )
    hf["architectures"] = [architecture]
    name = name or card.card_name(workdir)
    readme = card.model_card(
        name=name,
        record=record,
        config=config.to_dict(),
        results=results,
        metrics=metrics,
        dataset=dataset,
        pipeline_tag=pipeline_tag,
        note=note,
    )

    def write(folder: str) -> None:
        write_json(os.path.join(folder, filenames.CONFIG_FILE), hf)
        save_file(tensors, os.path.join(folder, WEIGHTS), metadata={"format": "pt"})
        # The length it was fine-tuned on: pipeline(..., truncation=True) cuts inputs as ours.
        write_tokenizer_files(tokenizer, folder, config.seq_length)
        with open(os.path.join(folder, filenames.README_FILE), "w", encoding="utf-8") as f:
            f.write(readme)

    manifest = {
        "source": paths.absolute(workdir),
        "family": record["family"],
        "task": record["task"],
        "architecture": architecture,
        "tokenizer_fingerprint": tokenizer.fingerprint,
    }
    return write_folder(out, manifest, write)


def _define_flags():
    # Defined only when run as a program, so that importing this module never clashes with the
    # flags of the train or finetune commands.
    flags.DEFINE_string(
        "workdir", None, "The workdir to export: pre-training (newest checkpoint) or fine-tuning."
    )
    flags.DEFINE_string("out", None, "Where discriminator/ and generator/ go (default WORKDIR/hf).")
    flags.DEFINE_string(
        "push_to_hub",
        None,
        "Then upload the export to this Hugging Face Hub model repository (NAMESPACE/NAME), "
        "created if missing; needs a token (hf auth login, or HF_TOKEN).",
    )
    flags.DEFINE_bool("hub_private", False, "Create the --push_to_hub repository private.")
    flags.DEFINE_float(
        "hub_timeout_seconds",
        900.0,
        "--push_to_hub: the upload (the repository's creation and the commit) ends within this "
        "many seconds, finished or not; the export stays in --out either way.",
    )
    flags.DEFINE_bool(
        "card_details",
        False,
        "Put the run's command lines and the paths of the machine that trained (the workdir, "
        "the corpus's folders, cache and tokenizer paths) in the pre-training model card; "
        "left out by default, as the card may go to a public Hub repository.",
    )
    flags.DEFINE_bool("verbose", False, "Show full tracebacks on errors.")


def main(argv) -> None:
    values = flags.FLAGS
    if len(argv) > 1:
        fail(f"unexpected arguments {argv[1:]}; use --workdir=... --out=...")
    if not values.workdir:
        fail("--workdir is required: the pre-training run to export, e.g. --workdir=runs/tiny")
    if not values.verbose:
        quiet_logs()
    if not values.hub_timeout_seconds > 0 or values.hub_timeout_seconds == float("inf"):
        fail(f"--hub_timeout_seconds={values.hub_timeout_seconds} must be a number of seconds > 0")
    from electra_jax.store.checkpoint_steps import split_step

    workdir, step = split_step(values.workdir)
    # WORKDIR@STEP's own default place: WORKDIR/hf holds the newest checkpoint's export.
    default = filenames.EXPORT_DIR if step is None else f"{filenames.EXPORT_DIR}-{step}"
    out = values.out or paths.join(workdir, default)
    from electra_jax.store.workdir_files import WorkdirFileError

    try:
        with no_answer_ends(values.verbose):  # a gs:// workdir or --out that stopped answering
            manifest = export(
                values.workdir,
                out,
                values.push_to_hub,
                values.hub_private,
                values.hub_timeout_seconds,
                card_details=values.card_details,
            )
    except (PretrainedError, WorkdirFileError) as e:
        if values.verbose:
            raise
        from electra_jax.hf import hub

        if isinstance(e, hub.HubTimeout):
            # At once: the abandoned upload's library threads must not hold the process up.
            print(f"error: {e}", file=sys.stderr, flush=True)
            os._exit(2)
        fail(str(e))
    if "architecture" in manifest:
        print(f"exported {manifest['task']} from {manifest['source']} to {os.path.abspath(out)}: "
              f"{manifest['architecture']}")  # fmt: skip
    else:
        print(
            f"exported {manifest['source']} to {os.path.abspath(out)}: discriminator "
            f"{manifest['discriminator_params']:,} params, generator "
            f"{manifest['generator_params']:,} params"
        )
    if manifest.get("hub_url"):
        print(f"uploaded to {values.push_to_hub}: {manifest['hub_url']}")


def cli() -> None:
    _define_flags()
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    cli()
