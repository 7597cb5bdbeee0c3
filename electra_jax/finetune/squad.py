"""The SQuAD family (1.1 and 2.0): the official JSON files -> windows [CLS] question [SEP]
context [SEP] -> a span head (and for 2.0 an answerability classifier) -> answers, exact match
and F1. configs/squad.py; the runner is loop.py.

Prediction keeps each window's top starts and ends on the device (SpanModel.predict), so that
only the n-best spans come back to be decoded into text (squad_eval).
"""

from __future__ import annotations

import functools
import json
import os

from electra_jax.finetune import checks, reading, squad_data, squad_eval, squad_heads
from electra_jax.finetune.family import Data, Family, Features
from electra_jax.store import filenames

PREDICTIONS_FILE = filenames.SQUAD_PREDICTIONS_FILE
NULL_SCORES_FILE = filenames.NULL_SCORES_FILE  # 2.0: the official script's --na-prob-file input
INPUTS = ("input_ids", "segment_ids", "input_mask")


def _json(obj) -> str:
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def featurizer(config, tokenizer):
    """make_features with the config's window settings: examples -> squad_data.Features."""
    return functools.partial(
        squad_data.make_features,
        tokenizer,
        seq_length=config.seq_length,
        doc_stride=config.doc_stride,
        max_query_length=config.max_query_length,
    )


def inputs(features: squad_data.Features) -> dict:
    """The [N, L] arrays the prediction step reads."""
    return {k: getattr(features, k) for k in INPUTS}


class Squad(Family):
    name = "squad"
    predictions_file = PREDICTIONS_FILE

    def describe(self, version: str) -> dict:
        return checks.describe(self.name, version)

    def read(self, config, version: str, dev_only: bool = False) -> Data:
        return reading.read_squad(config, version, dev_only)

    def input_files(self, config, version: str) -> tuple[list[str], dict | None]:
        return [os.path.join(config.data_dir, n) for n in squad_data.file_names(version)], None

    def featurize(self, config, version: str, data: Data, tokenizer) -> Features:
        featurize = featurizer(config, tokenizer)
        train, dev = featurize(data.train), featurize(data.dev["dev"])
        summary = (
            f"SQuAD {version}: {len(data.train)} training questions ({data.num_read} read) in "
            f"{len(train)} windows, dev {len(data.dev['dev'])} in {len(dev)} windows"
        )
        # Steps count windows, as the original counts its training records.
        return Features(train.model_inputs(), {"dev": dev}, config.num_epochs, "windows", summary)

    def network(self, config, version: str, spec):
        return squad_heads.SpanModel(
            spec,
            joint=config.joint_prediction,
            answerable=version == "2.0",
            head_size=config.head_size,
            top_k=config.n_best_size,
        )

    def init_params(self, model, rng) -> dict:
        return squad_heads.init_params(model, rng)

    def loss(self, config, version: str, model, params, batch: dict, rng):
        outputs = model.apply(
            {"params": params},
            batch["input_ids"],
            batch["segment_ids"],
            batch["input_mask"],
            batch["start_positions"],
            False,
            rngs={"dropout": rng},
        )
        weight = float(config.answerable_weight) if version == "2.0" else 0.0
        return squad_heads.span_loss(outputs, batch, weight)

    def predict_step(self, config, version: str, model, params, batch: dict) -> dict:
        """SpanModel.predict (see there for the outputs)."""
        return model.apply(
            {"params": params}, *(batch[k] for k in INPUTS), method=squad_heads.SpanModel.predict
        )

    def evaluate(self, config, version: str, predict, data: Data, feats: Features, check):
        dev, dev_features = data.dev["dev"], feats.dev["dev"]
        outputs = predict(inputs(dev_features))
        check(outputs["finite"], "dev windows")
        answers, null_scores = squad_eval.predict_answers(
            dev,
            dev_features,
            outputs,
            version=version,
            n_best_size=config.n_best_size,
            max_answer_length=config.max_answer_length,
            null_threshold=config.null_threshold,
        )
        metrics = squad_eval.evaluate(dev, answers, version)
        results = {
            "task": f"SQuAD {version}",
            "version": version,
            **metrics,
            "num_train_examples": len(data.train),
            "num_train_examples_read": data.num_read,
            "num_train_windows": len(feats.train["input_ids"]),
            "num_dev_examples": len(dev),
            "num_dev_windows": len(dev_features),
            "joint_prediction": config.joint_prediction,
        }
        files = {PREDICTIONS_FILE: _json(answers)}
        if version == "2.0":
            results["null_threshold"] = config.null_threshold
            files[NULL_SCORES_FILE] = _json(null_scores)
        return results, files

    def shown(self, results: dict) -> tuple[list[str], str]:
        metrics = {k: results[k] for k in ("exact_match", "f1")}
        if results["version"] == "2.0":
            for prefix in ("HasAns", "NoAns"):
                metrics.update({k: results[k] for k in (f"{prefix}_exact", f"{prefix}_f1")})
        shown = "  ".join(f"{k} {v:.2f}" for k, v in metrics.items())
        score = f"exact_match {results['exact_match']:.2f}, f1 {results['f1']:.2f}"
        return [f"{results['task']} dev: {shown}"], score


SQUAD = Squad()
