"""The GLUE family: one task's TSVs (or TFDS) -> [CLS] A [SEP] B [SEP] rows -> a linear layer on
[CLS] -> the task's dev metrics. configs/glue.py; the runner is loop.py.

The host reads and tokenizes the task once; STS-B trains on its scores divided by 5 (as the
original) and reports them on 0-5; MRPC and STS-B train on both orders of each pair.
"""

from __future__ import annotations

import functools
import json

import jax.numpy as jnp
import numpy as np

from electra_jax.finetune import checks, features, glue_heads, reading, tasks
from electra_jax.finetune import glue_metrics as glue_metrics
from electra_jax.finetune.family import Data, Family, Features
from electra_jax.store import filenames

PREDICTIONS_FILE = filenames.GLUE_PREDICTIONS_FILE


def regression_targets(task: tasks.Task, scaled: bool) -> tuple[float, float]:
    """(low, width): the model trains on (score - low) / width and reports low + width x output.

    With `scaled`, a task's scores become [0, 1] targets, as the original ELECTRA trains STS-B
    (its classification_tasks.py divides the 0-5 score by 5); otherwise the raw scores.
    """
    if not (scaled and task.is_regression):
        return 0.0, 1.0
    low, high = task.score_range
    return low, high - low


def predict_step(params, batch: dict, *, model, regression: bool) -> dict:
    """[B, L] inputs -> 'outputs' [B, C] float32 logits (or [B, 1] scores, on the training
    scale), 'prediction' [B] (classes int32 or scores float32) and 'finite' [B] (whether every
    output is finite), without dropout."""
    outputs = model.apply(
        {"params": params}, batch["input_ids"], batch["segment_ids"], batch["input_mask"], True
    )
    return {
        "outputs": outputs,
        "prediction": glue_heads.predictions(outputs, regression),
        "finite": jnp.all(jnp.isfinite(outputs), axis=-1),
    }


class Glue(Family):
    name = "glue"
    predictions_file = PREDICTIONS_FILE

    def describe(self, task: tasks.Task) -> dict:
        return checks.describe(self.name, task)

    def read(self, config, task: tasks.Task, dev_only: bool = False) -> Data:
        return reading.read_glue(config, task, dev_only)

    def input_files(self, config, task: tasks.Task) -> tuple[list[str], dict | None]:
        if not config.data_dir:  # TFDS: named, not hashed (TFDS versions what it prepared)
            return [], {"dataset": task.tfds_name, "data_dir": config.tfds_data_dir}
        splits = (tasks.TRAIN, *task.dev_splits)
        return [tasks.tsv_path(task, config.data_dir, s) for s in splits], None

    def featurize(self, config, task: tasks.Task, data: Data, tokenizer) -> Features:
        encode = functools.partial(
            features.encode_examples,
            tokenizer,
            seq_length=config.seq_length,
            regression=task.is_regression,
        )
        train = encode(data.train)
        # Regression trains on targets in [0, 1] (by default, as the original); dev labels,
        # metrics and predictions stay on the task's own scale.
        low, width = regression_targets(task, config.scale_regression_targets)
        if task.is_regression:
            train["labels"] = ((train["labels"] - low) / width).astype(np.float32)
        summary = f"{task.name}: {len(data.train)} training examples ({data.num_read} read), " + (
            ", ".join(f"{name} {len(ex)}" for name, ex in data.dev.items())
        )
        return Features(
            train=train,
            dev={name: encode(ex) for name, ex in data.dev.items()},
            epochs=config.num_epochs or task.num_epochs,
            unit="examples",
            summary=summary,
        )

    def network(self, config, task: tasks.Task, spec):
        return glue_heads.Classifier(spec, task.num_outputs)

    def init_params(self, model, rng) -> dict:
        return glue_heads.init_params(model, rng)

    def loss(self, config, task: tasks.Task, model, params, batch: dict, rng):
        outputs = model.apply(
            {"params": params},
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            False,
            rngs={"dropout": rng},
        )
        total, count = glue_heads.task_loss(outputs, batch["labels"], task.is_regression)
        return total / count

    def predict_step(self, config, task: tasks.Task, model, params, batch: dict) -> dict:
        return predict_step(params, batch, model=model, regression=task.is_regression)

    def evaluate(self, config, task: tasks.Task, predict, data: Data, feats: Features, check):
        low, width = regression_targets(task, config.scale_regression_targets)
        metrics, rows = {}, []
        for name, arrays in feats.dev.items():
            out = predict(arrays)
            check(out["finite"], f"{name} examples")
            preds = out["prediction"]
            if task.is_regression:  # back on the task's scale
                preds = (low + width * preds.astype(np.float64)).astype(np.float32)
            metrics[name] = glue_metrics.task_metrics(task, preds, arrays["labels"])
            for i, (example, pred) in enumerate(zip(data.dev[name], preds, strict=True)):
                rows.append(
                    {
                        "split": name,
                        "index": i,
                        "source": example.source,
                        "label": tasks.label_text(task, example.label),
                        "prediction": tasks.label_text(task, pred),
                    }
                )
        first_dev = task.dev_splits[0].name
        results = {
            "task": task.name,
            "metrics": metrics,
            "score": metrics[first_dev][task.score],
            "score_metric": f"{first_dev}/{task.score}",
            "num_train_examples": len(data.train),
            "num_train_examples_read": data.num_read,
            "num_dev_examples": {name: len(ex) for name, ex in data.dev.items()},
            "scale_regression_targets": bool(
                task.is_regression and config.scale_regression_targets
            ),
        }
        files = {PREDICTIONS_FILE: "".join(json.dumps(r) + "\n" for r in rows)}
        return results, files

    def shown(self, results: dict) -> tuple[list[str], str]:
        lines = []
        for name, values in results["metrics"].items():
            shown = "  ".join(f"{k} {v:.4f}" for k, v in values.items())
            lines.append(f"{results['task']} {name}: {shown}")
        return lines, f"{results['score_metric']} {results['score']:.4f}"


GLUE = Glue()
