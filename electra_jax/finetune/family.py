"""A task family: what the one fine-tuning runner (loop.py) asks of GLUE and of SQuAD.

As the original ELECTRA's run_finetuning.py asks its Task (get_examples, featurize,
get_prediction_module, get_scorer), the runner asks a family to read its data, turn it into
fixed-shape arrays, build its network, score a batch, predict and evaluate. Its config fields
are checked in checks.py, without jax, so that the command answers bad settings first.
Everything else (the model's start, the optimizer, the step loop with its finite checks and
ETA, checkpoints and resuming, the saved weights) is the runner's, written once.
`config.family` ('glue' or 'squad') names the family; loop.FAMILIES maps it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

# Random streams under the one seed: the subset kept by max_train_examples is drawn from a fixed
# stream (every seed fine-tunes on the same examples, so seeds measure the fine-tuning's own
# variance); the epoch shuffles from the run's seed.
SUBSET_STREAM, ORDER_STREAM = 1, 2


def fixed_subset(examples: Sequence[Any], max_examples: int) -> list[Any]:
    """At most max_examples of `examples` (0 = all): a fixed random subset, kept in order, the
    same for every seed."""
    examples = list(examples)
    if 0 < max_examples < len(examples):
        rng = np.random.default_rng([0, SUBSET_STREAM])
        keep = np.sort(rng.choice(len(examples), max_examples, replace=False))
        examples = [examples[i] for i in keep]
    return examples


@dataclasses.dataclass
class Data:
    """A family's examples as read, before tokenizing."""

    train: list  # what is trained on (after the cap and, for GLUE, the doubled pairs)
    num_read: int  # training examples in the files
    dev: dict[str, list]  # dev set name -> examples
    texts: list[str]  # text to train a tokenizer on (random init without config.tokenizer)


@dataclasses.dataclass
class Features:
    """A family's examples as the device reads them."""

    train: dict[str, np.ndarray]  # [N, ...] arrays, one row per training example or window
    dev: dict[str, Any]  # dev set name -> what the family's `evaluate` reads
    epochs: float  # epochs over the N rows; steps = int(N x epochs / batch), at least 1
    unit: str  # what a row is, for the progress lines ('examples', 'windows')
    summary: str  # one log line: the counts


class Family:
    """The interface; glue.GLUE and squad.SQUAD implement it (see each method).

    `task` below is what checks.check_config returns of the config (which checks each family's
    settings without jax): the GLUE task, or the SQuAD version.
    """

    name: str  # 'glue' | 'squad': config.family
    predictions_file: str

    def describe(self, task) -> dict:
        """What model.json records of the task: 'task' (its name), 'labels' (class names, []
        when there are none) and 'problem_type' (transformers' word for the head's loss)."""
        raise NotImplementedError

    def read(self, config, task, dev_only: bool = False) -> Data:
        """The training and dev examples (DataError for bad files, before any tokenizing)."""
        raise NotImplementedError

    def input_files(self, config, task) -> tuple[list[str], dict | None]:
        """(the local files `read` reads, a TFDS source's description or None): what a resume
        is held to (inputs.py)."""
        raise NotImplementedError

    def featurize(self, config, task, data: Data, tokenizer) -> Features:
        raise NotImplementedError

    def network(self, config, task, spec):
        """The Flax module of the whole network (encoder and head)."""
        raise NotImplementedError

    def init_params(self, model, rng) -> dict:
        raise NotImplementedError

    def loss(self, config, task, model, params, batch: dict, rng):
        """The float32 scalar loss of a training batch (dropout from `rng`)."""
        raise NotImplementedError

    def predict_step(self, config, task, model, params, batch: dict) -> dict:
        """The outputs of [B, L] input_ids, segment_ids, input_mask, without dropout: a dict of
        [B, ...] arrays with 'finite' [B] bool among them."""
        raise NotImplementedError

    def evaluate(self, config, task, predict, data: Data, features: Features, check) -> tuple:
        """(results, files): the dev metrics and the family's fields of eval_results.json, and
        {file name: text} of the prediction files. `predict(inputs)` gives predict_step's outputs
        for [N, L] arrays; `check(finite, what)` raises NonFiniteError for non-finite outputs."""
        raise NotImplementedError

    def shown(self, results: dict) -> tuple[list[str], str]:
        """(log lines of the dev metrics, the headline score in a few words)."""
        raise NotImplementedError
