"""What a fine-tuning run reads of its task before anything is tokenized: a family's examples
(family.Data), without jax.

The families' `read` (glue.py, squad.py) are these functions. The command reads a new run's task
with them before it imports jax, flax and orbax (finetune/__main__.py), so that a missing or
malformed task file is answered in a blink, and hands what it read to the runner.
"""

from __future__ import annotations

import dataclasses
import os

from electra_jax.errors import DataError
from electra_jax.finetune import squad_data, tasks
from electra_jax.finetune.family import Data, fixed_subset


def training_set(
    task: tasks.Task, examples: list[tasks.Example], max_examples: int, double_unordered: bool
) -> list[tasks.Example]:
    """The examples trained on: a fixed random subset of at most max_examples (0 = all, kept in
    file order), then for MRPC and STS-B also every pair the other way round."""
    examples = fixed_subset(examples, max_examples)
    if double_unordered and task.double_unordered:
        swapped = [
            dataclasses.replace(e, text_a=e.text_b, text_b=e.text_a, source=e.source + ":swapped")
            for e in examples
        ]
        examples = examples + swapped
    return examples


def read_glue(config, task: tasks.Task, dev_only: bool = False) -> Data:
    """A GLUE task's training set (training_set) and dev splits, from config.data_dir's TSVs or
    TFDS; DataError (one line, naming the file) for what cannot be read."""
    read = lambda split: tasks.load_split(task, split, config.data_dir, config.tfds_data_dir)
    train_read = [] if dev_only else read(tasks.TRAIN)
    dev = {split.name: read(split) for split in task.dev_splits}
    if dev_only:
        return Data([], 0, dev, [])
    train = training_set(task, train_read, config.max_train_examples, config.double_unordered)
    if not train:
        raise DataError(f"{task.name} has no training examples; check config.data_dir")
    texts = [t for e in train_read for t in (e.text_a, e.text_b) if t]
    return Data(train, len(train_read), dev, texts)


def read_squad(config, version: str, dev_only: bool = False) -> Data:
    """SQuAD `version`'s training questions (at most config.max_train_examples) and dev set, from
    config.data_dir; DataError (one line, naming the file) for what cannot be read."""
    train_path, dev_path = (
        os.path.join(config.data_dir, name) for name in squad_data.file_names(version)
    )
    train_read = [] if dev_only else squad_data.read_squad(train_path, version)
    dev = squad_data.read_squad(dev_path, version)
    train = fixed_subset(train_read, config.max_train_examples)
    if not train and not dev_only:
        raise DataError(f"{train_path} has no questions; check config.data_dir")
    if not dev:
        raise DataError(f"{dev_path} has no questions; check config.data_dir")
    texts = sorted({e.context for e in train_read}) + [e.question for e in train_read]
    return Data(train, len(train_read), {"dev": dev}, texts)


# By config.family: what checks.check_config names the family, with the task it resolves.
READERS = {"glue": read_glue, "squad": read_squad}
