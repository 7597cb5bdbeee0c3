"""The model cards of exports: README.md with the YAML front matter the Hugging Face Hub reads,
then what the model is, written from the workdir's own records only. Nothing in it is typed by
hand.

A fine-tuned export's (`model_card`): pipeline tag, datasets, tags, model-index with the dev
score; from model.json (the task, the labels, the pre-training's corpus, steps and counted FLOPs,
the command), config.json (the fine-tuning settings) and eval_results.json (the dev metrics).

A pre-training export's (`pretraining_card`): from config.json (corpus, objective, batch, the
settings), the checkpoint's step, the FLOPs counted for it, metrics.jsonl's row of that step,
the held-out readings (metrics.jsonl and eval.jsonl) and, when asked for (--card_details),
commands.jsonl (the command lines) and the workdir's paths: a card may go to a public Hub
repository, so by default it names the corpus without its folders and no path of the machine.

The front matter's values are written as JSON, which YAML reads as they are.
"""

from __future__ import annotations

import json
import os

from electra_jax.data import mixture
from electra_jax.errors import ConfigError
from electra_jax.store import paths


def _yaml(fields: dict) -> str:
    return "".join(f"{key}: {json.dumps(value)}\n" for key, value in fields.items())


def _number(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _pretraining(record: dict) -> list[str]:
    pre = record.get("pretraining")
    if not pre:
        return [
            "None: the encoder started from random weights (a baseline), with a tokenizer "
            "trained on the task's text."
        ]
    lines = [f"- source: `{pre.get('source')}`"]
    if pre.get("kind") == "workdir":
        if pre.get("corpus") is not None:
            key = "data.mixture" if _is_mixture(pre["corpus"]) else "data.source"
            lines.append(f"- corpus (`{key}`): `{pre['corpus']}`")
        if pre.get("objective"):
            lines.append(f"- objective: `{pre['objective']}`")
        steps = f"- steps: {pre['step']:,}"
        if pre.get("planned_steps"):
            steps += f" of the {pre['planned_steps']:,} planned"
        if pre.get("batch_size"):
            steps += f", batch {pre['batch_size']} x {pre['seq_length']} tokens"
        lines.append(steps)
        if pre.get("flops"):
            lines.append(
                f"- training compute: {pre['flops']:.3e} FLOPs (counted: "
                f"{pre['flops_per_step']:.3e} per step, forward and backward, by "
                "electra_jax.pretraining.metrics.count_flops)"
            )
        row = pre.get("metrics") or {}
        shown = [
            f"{k} {_number(row[k])}" for k in ("loss", "disc_accuracy", "gen_accuracy") if k in row
        ]
        if shown:
            lines.append(f"- last logged (step {row.get('step')}): " + ", ".join(shown))
    elif pre.get("kind") == "export":
        source = (pre.get("export") or {}).get("source")
        lines.append("- an electra_jax export" + (f" of `{source}`" if source else ""))
    else:
        lines.append("- transformers ELECTRA files (pre-trained outside electra_jax)")
    return lines


def _head(front: dict, name: str, summary: str) -> list[str]:
    """The front matter, the title and the summary, up to the pre-training section's lines."""
    return ["---", _yaml(front).rstrip("\n"), "---", "", f"# {name}", "", summary, "",
            "## Pre-training", ""]  # fmt: skip


def _config(title: str, config: dict) -> list[str]:
    return [f"## {title}", "", "```json", json.dumps(config, indent=2, sort_keys=True), "```", ""]


def model_card(
    *,
    name: str,
    record: dict,
    config: dict,
    results: dict,
    metrics: dict,
    dataset: dict,
    pipeline_tag: str,
    note: str,
) -> str:
    """README.md text. metrics: {metric name: dev value} for the model-index; dataset: the
    Hub's dataset fields (name, type, config, split)."""
    task = record["task"]
    front = {
        "library_name": "transformers",
        "pipeline_tag": pipeline_tag,
        "tags": ["electra", "electra_jax", record["family"], task.lower().replace(" ", "-")],
        "datasets": [dataset["type"]],
        "metrics": sorted(metrics),
        "model-index": [
            {
                "name": name,
                "results": [
                    {
                        "task": {"type": pipeline_tag},
                        "dataset": dataset,
                        "metrics": [
                            {"type": k, "value": v, "name": f"dev {k}"} for k, v in metrics.items()
                        ],
                    }
                ],
            }
        ],
    }
    command = record.get("command")
    lines = [
        *_head(front, name, f"An ELECTRA discriminator fine-tuned on {task} with electra_jax."),
        *_pretraining(record),
        "",
        "## Fine-tuning",
        "",
        f"- task: {task} ({record['family']})"
        + (f", labels {', '.join(record['labels'])}" if record.get("labels") else ""),
        "- dev: " + ", ".join(f"{k} {_number(v)}" for k, v in metrics.items()),
        f"- {results.get('steps')} steps ({_number(results.get('epochs'))} epochs) of batch "
        f"{results.get('batch_size')}, {config.get('seq_length')} tokens; peak learning rate "
        f"{results.get('learning_rate')} ({results.get('learning_rate_source')}), layer decay "
        f"{results.get('layer_decay')} ({results.get('layer_decay_source')}); seed "
        f"{results.get('seed')}; {results.get('num_train_examples')} training examples",
        "- command: "
        + (
            f"`{command}`"
            if command
            else "through the Python API (electra_jax.finetune.loop.finetune) with the config below"
        ),
        "",
        "## Use",
        "",
        "```python",
        "from transformers import pipeline",
        "",
        f'model = pipeline("{pipeline_tag}", model="{name}")  # this folder',
        "```",
        "",
        note,
        "",
        *_config("The fine-tuning config", config),
    ]
    return "\n".join(lines)


# The held-out readings a pre-training card shows (eval_pass.py has them all), in this order.
_HELDOUT_SHOWN = ("disc_auc", "disc_auc_frequent", "disc_auc_unigram", "disc_accuracy")

# The config keys that hold a place on the machine that trained (or a bucket): a card may go to
# a public Hub repository, so they are left out of it unless asked for (`details`).
_PLACES = ("data.cache_dir", "data.tokenizer", "data.tfds_data_dir", "train.init_from",
           "compile.cache_dir")  # fmt: skip
_NOT_SHOWN = "(not shown: export with --card_details)"
_NO_LICENSE = "- license: none stated (export.license not set in the run's config)"


def _is_mixture(corpus: str | None) -> bool:
    """Whether a run's corpus is a data.mixture (two or more parts, so a ';'), not a source."""
    if not corpus or ";" not in corpus:
        return False
    try:
        mixture.parse(corpus)
    except ConfigError:
        return False
    return True


def public_corpus(source: str | None) -> str | None:
    """data.source as a card may show it: a TFDS name, builtin and hf:// globs as they are (public
    names); a file glob by its kind and its last part only ('text:/home/me/wiki/*.txt' ->
    'text:.../*.txt'), its folders being the machine's or a bucket's. A data.mixture: each
    part so, with its name and weight."""
    if _is_mixture(source):
        parts = mixture.parse(source).parts
        return ";".join(f"{p.name}={public_corpus(p.source)}:{p.weight:g}" for p in parts)
    if not source or ":" not in source or source.startswith("tfds:"):
        return source
    kind, rest = source.split(":", 1)
    if rest.startswith("hf://"):
        return source
    column = ""
    head, sep, tail = rest.rpartition(":")
    if sep and "/" not in tail:  # GLOB:COLUMN (sources.py's rule)
        rest, column = head, f":{tail}"
    last = rest.rstrip("/").rsplit("/", 1)[-1]
    return f"{kind}:{'.../' if last != rest else ''}{last}{column}"


def _public_config(config: dict) -> dict:
    """config.json's settings without the places of the machine that trained (_PLACES), and
    data.source as public_corpus gives it."""
    out = json.loads(json.dumps(config))
    for key in _PLACES:
        section, name = key.split(".")
        if out.get(section, {}).get(name):
            out[section][name] = _NOT_SHOWN
    for key in ("source", "mixture"):
        if isinstance(out.get("data"), dict) and out["data"].get(key):
            out["data"][key] = public_corpus(out["data"][key])
    return out


def pretraining_card(
    *,
    name: str,
    record: dict,
    config: dict,
    heldout: dict | None,
    commands: list[dict],
    details: bool = False,
) -> str:
    """README.md text of a pre-training export (OUT/discriminator and OUT/generator).

    record: what finetune.saved.pretraining_record reads of the workdir at the exported step
    (the fine-tuned card's "Pre-training" section, the same lines); heldout: the held-out row
    (``eval/`` keys, with its step) at or before that step, or None; commands: commands.jsonl's
    rows ({step, command}), oldest first. Without `details` (export's --card_details) the card
    names no path of the machine that trained, nor its command lines: the workdir by its name,
    the corpus by public_corpus, the config's places left out.
    """
    if not details:
        record = {**record, "source": f"{name} (checkpoint {record.get('step')})"}
        record["corpus"] = public_corpus(record.get("corpus"))
        config = _public_config(config)
    tags = ["electra", "electra_jax", "pretraining"]
    objective = record.get("objective")
    # export.license as the run states it, never guessed; absent from a run older than the key.
    license_id = (config.get("export") or {}).get("license") or ""
    front = {"library_name": "transformers", **({"license": license_id} if license_id else {})}
    front["tags"] = tags + ([objective] if objective and objective not in tags else [])
    summary = (
        "An ELECTRA pre-trained with electra_jax: `discriminator/` (ElectraForPreTraining, the "
        "encoder to fine-tune) and `generator/` (ElectraForMaskedLM), each with its tokenizer."
    )
    lines = [
        *_head(front, name, summary),
        *_pretraining({"pretraining": record}),
        *_heldout(heldout),
        *(_commands(commands) if details else [f"- command lines: {_NOT_SHOWN}"]),
        f"- license: {license_id}" if license_id else _NO_LICENSE,
        "",
        "## Use",
        "",
        "```python",
        "from transformers import AutoTokenizer, ElectraForPreTraining",
        "",
        f'model = ElectraForPreTraining.from_pretrained("{name}", subfolder="discriminator")',
        f'tokenizer = AutoTokenizer.from_pretrained("{name}", subfolder="discriminator")',
        "```",
        "",
        "Fine-tune it with `python -m electra_jax.finetune --config.init_from=hf:FOLDER` or as "
        "any transformers ELECTRA.",
        "",
        *_config("The pre-training config", config),
    ]
    return "\n".join(lines)


def _heldout(row: dict | None) -> list[str]:
    if not row:
        return ["- held-out: not evaluated (eval.every_steps, or python -m electra_jax.evaluate)"]
    shown = [f"{k} {_number(row[f'eval/{k}'])}" for k in _HELDOUT_SHOWN if f"eval/{k}" in row]
    seen = " (rows the run trained on)" if row.get("eval/trained_on") else ""
    return [f"- held-out at step {row.get('step')}{seen}: " + ", ".join(shown)]


def _commands(rows: list[dict]) -> list[str]:
    if not rows:
        return ["- command: not recorded (a run started through the Python API, or before "
                "commands.jsonl)"]  # fmt: skip
    first = rows[0]
    what = "command"
    if first.get("step") != 0:
        what = f"command at step {first.get('step')} (the start's is not recorded)"
    lines = [f"- {what}: `{first.get('command')}`"]
    if len(rows) > 1:
        last = rows[-1]
        lines.append(
            f"- resumed {len(rows) - 1} time(s), last at step {last.get('step')}: "
            f"`{last.get('command')}`"
        )
    return lines


def glue_dataset(tfds_name: str, split: str) -> dict:
    """The Hub's dataset fields of a GLUE task ('glue/sst2')."""
    family, _, subset = tfds_name.partition("/")
    return {"name": f"GLUE {subset.upper()}", "type": family, "config": subset, "split": split}


def squad_dataset(version: str) -> dict:
    kind = "squad_v2" if version == "2.0" else "squad"
    return {"name": f"SQuAD {version}", "type": kind, "split": "validation"}


def card_name(workdir: str) -> str:
    """The workdir's folder name (a gs:// one's last name too)."""
    return os.path.basename(paths.absolute(workdir))
