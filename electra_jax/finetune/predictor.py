"""A fine-tuned model from its workdir, ready to predict: `electra_jax.load(FINETUNE_WORKDIR)`.

    model = electra_jax.load("runs/tiny-sst2")
    labels, probabilities = model.predict(["a gripping, funny film", "dull"])
    model.predict([("A man plays.", "Someone plays.")])     # pairs, for MRPC, RTE, ...
    scores = electra_jax.load("runs/tiny-stsb").predict([("A cat sits.", "A cat sat.")])
    electra_jax.load("runs/tiny-squad").answer("Who lives in Oslo?", "Anna lives in Oslo.")
    model.evaluate()  # the dev metrics again, as eval_results.json has them

The network, its tokenizer and its settings are the run's own (model.json, tokenizer/,
config.json, model.safetensors); inputs are encoded and predicted with the very code and the
compiled program the run evaluated with (rows of config.seq_length tokens, batches of
config.eval_batch_size, the local devices data-parallel), so re-evaluating the dev set gives
eval_results.json's numbers exactly, on the same kind of machine.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np

from electra_jax.errors import ConfigError, PretrainedError
from electra_jax.finetune import features, loop, results, saved, squad_data, squad_eval, tasks
from electra_jax.finetune.glue import regression_targets
from electra_jax.finetune.squad import featurizer, inputs
from electra_jax.model import sharding
from electra_jax.pretrained import length_argument, text_argument, texts_argument
from electra_jax.run import workdir as workdir_lib
from electra_jax.store import paths


class Classified(NamedTuple):
    """predict()'s answer for N inputs of a classification task."""

    labels: list[str]  # [N] the most probable label of each input, as the task names it
    probabilities: np.ndarray  # [N, C] float32, columns in the order of Finetuned.labels


@dataclasses.dataclass
class Finetuned:
    """What every fine-tuned model has; `TextClassifier` and `QuestionAnswerer` predict."""

    workdir: str
    config: ml_collections.ConfigDict  # the run's config.json
    record: dict  # model.json
    family: Any
    task: Any
    spec: Any
    tokenizer: Any
    params: Any  # device arrays, replicated over the local devices
    predict_fn: Any  # jitted family.predict_step

    @property
    def labels(self) -> tuple[str, ...]:
        """The class names in output order; () for STS-B and SQuAD."""
        return tuple(self.record.get("labels", ()))

    def __repr__(self) -> str:
        d = self.spec.discriminator
        return (
            f"electra_jax.{type(self).__name__}({self.record['task']} from {self.workdir}: "
            f"{d.num_layers} layers, hidden {d.hidden_size})"
        )

    def _predict(self, arrays: dict) -> dict:
        return results.predict(self.predict_fn, self.params, arrays, self.config.eval_batch_size)

    def evaluate(self, data_dir: str | None = None) -> dict:
        """The family's dev results (GLUE: `metrics`, `score`, ...; SQuAD: `exact_match`, `f1`,
        ...), recomputed from the saved weights on the dev files of `data_dir` (default: the
        run's config.data_dir)."""
        config = self.config
        if data_dir is not None:
            config = ml_collections.ConfigDict(config.to_dict())
            config.data_dir = data_dir
        data = self.family.read(config, self.task, dev_only=True)
        feats = self.family.featurize(config, self.task, data, self.tokenizer)

        def check(finite: np.ndarray, what: str) -> None:
            if not finite.all():
                raise ValueError(
                    f"the saved model's outputs are not finite for {int((~finite).sum())} of the "
                    f"{len(finite)} {what}"
                )

        results, _ = self.family.evaluate(config, self.task, self._predict, data, feats, check)
        return results


def _examples(texts: str | Sequence[str | tuple[str, str]], regression: bool) -> list:
    """Strings or (a, b) pairs -> tasks.Example rows (label 0: not read)."""
    out = []
    for i, t in enumerate(texts_argument(texts)):
        a, b = t if isinstance(t, tuple) else (t, None)
        out.append(tasks.Example(a, b, 0.0 if regression else 0, f"input[{i}]"))
    return out


class TextClassifier(Finetuned):
    """A GLUE model: sentences or sentence pairs -> labels and probabilities, or STS-B scores."""

    def outputs(self, texts: str | Sequence[str | tuple[str, str]]) -> np.ndarray:
        """The head's outputs for N strings or (a, b) pairs: [N, C] float32 logits, or for a
        regression task (STS-B) [N, 1] float32 scores on the task's scale (0-5), which is what
        the transformers export's logits are."""
        regression = self.task.is_regression
        arrays = features.encode_examples(
            self.tokenizer,
            _examples(texts, regression),
            seq_length=self.config.seq_length,
            regression=regression,
        )
        out = self._predict(arrays)["outputs"]
        if regression:
            low, width = regression_targets(self.task, self.config.scale_regression_targets)
            out = (low + width * out.astype(np.float64)).astype(np.float32)
        return out

    def predict(self, texts: str | Sequence[str | tuple[str, str]]) -> Classified | np.ndarray:
        """Classification: `Classified(labels, probabilities)`: labels [N] str (the task's
        names, e.g. SST-2's '0' / '1', MNLI's 'entailment'), probabilities [N, C] float32
        (softmax of the logits, columns in `self.labels` order). Regression (STS-B): [N]
        float32 similarity scores on the task's 0-5 scale.

        Inputs are cut to config.seq_length tokens as in training (the longer text of a pair
        first).
        """
        out = self.outputs(texts)
        if self.task.is_regression:
            return out[:, 0]
        shifted = out - out.max(axis=-1, keepdims=True)
        probabilities = np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)
        labels = [self.labels[i] for i in np.argmax(out, axis=-1)]
        return Classified(labels, probabilities.astype(np.float32))


class QuestionAnswerer(Finetuned):
    """A SQuAD model: a question and a context -> answer spans with scores."""

    def answer(self, question: str, context: str, n_best: int | None = None) -> dict:
        """The answer to `question` in `context`, decoded as the dev set is.

        Returns {'answer': str (the best span's text; '' when a 2.0 model's no-answer score
        exceeds config.null_threshold or no span is valid), 'spans': [{'text', 'start', 'end',
        'score'}] best first (at most n_best, default config.n_best_size; context[start:end] is
        the text; score: start + end score, log-probabilities for a joint head), 'no_answer_score':
        float (2.0: the lowest answerability logit over the context's windows) or None (1.1)}.
        """
        text_argument("question", question)
        text_argument("context", context)
        if n_best is not None:
            length_argument("n_best", n_best, 1)
        config = self.config
        example = squad_data.Example("q", question, context, (), "answer()")
        feats = featurizer(config, self.tokenizer)([example])
        outputs = self._predict(inputs(feats))
        spans, null = squad_eval.example_answers(
            example,
            list(range(len(feats))),
            feats,
            outputs,
            n_best_size=n_best or config.n_best_size,
            max_answer_length=config.max_answer_length,
        )
        best = spans[0].text if spans else ""
        version2 = config.version == "2.0"
        if version2 and null > config.null_threshold:
            best = ""
        return {
            "answer": best,
            "spans": [
                {"text": c.text, "start": c.char_start, "end": c.char_end, "score": c.score}
                for c in spans
            ],
            "no_answer_score": null if version2 else None,
        }


def is_finetuned(path: str) -> bool:
    """Whether `path` is a fine-tuning workdir (its marker says so, or it has model.json)."""
    path = os.fspath(path)
    if not paths.isdir(path):
        return False
    return workdir_lib.kind_of(path) == workdir_lib.FINETUNE or paths.isfile(
        paths.join(path, saved.MODEL_FILE)
    )


def read_run(workdir: str) -> tuple[ml_collections.ConfigDict, dict, Any, Any]:
    """(config, model.json, family, task) of a fine-tuning workdir; PretrainedError naming the
    file when one is missing, damaged, or of a family or task this version does not know."""
    record = saved.read_model(workdir)
    config_path = paths.join(workdir, saved.CONFIG_FILE)
    config = ml_collections.ConfigDict(saved.read_json(config_path, "restore it from a copy"))
    try:
        family, task = loop.check_config(config)
    except ConfigError as e:
        raise PretrainedError(
            f"{config_path}: {e} (a task this version does not know: export it with the version "
            "that trained it)"
        ) from None
    described = family.describe(task)
    if described["task"] != record.get("task") or described["labels"] != record.get("labels"):
        raise PretrainedError(
            f"{paths.join(workdir, saved.MODEL_FILE)} says task {record.get('task')!r} with "
            f"labels {record.get('labels')}, but {described['task']} has {described['labels']} "
            "now; export it with the version that trained it"
        )
    return config, record, family, task


def load(workdir: str) -> TextClassifier | QuestionAnswerer:
    """A fine-tuning workdir's model: `TextClassifier` (GLUE) or `QuestionAnswerer` (SQuAD).

    Raises:
      PretrainedError: the workdir has no saved weights (the run has not finished) or a file is
        missing or damaged; the message names it.
    """
    workdir = os.fspath(workdir)
    config, record, family, task = read_run(workdir)
    where = paths.join(workdir, saved.MODEL_FILE)
    spec = saved.spec_from_json(record.get("spec"), where)
    tokenizer = saved.load_tokenizer(workdir, record.get("tokenizer_fingerprint"))
    model = family.network(config, task, spec)
    abstract = jax.eval_shape(functools.partial(family.init_params, model), jax.random.PRNGKey(0))
    params = saved.load_weights(workdir, abstract)
    try:
        mesh = loop.local_mesh(config)
    except Exception as e:  # ConfigError: eval_batch_size does not split over these devices
        raise PretrainedError(f"{workdir}: {e}") from None
    replicated = sharding.replicated(mesh)
    predict_fn = jax.jit(
        functools.partial(family.predict_step, config, task, model),
        in_shardings=(replicated, sharding.batch_sharding(mesh)),
        out_shardings=replicated,
    )
    cls = QuestionAnswerer if family.name == "squad" else TextClassifier
    return cls(
        workdir,
        config,
        record,
        family,
        task,
        spec,
        tokenizer,
        jax.device_put(params, replicated),
        predict_fn,
    )
