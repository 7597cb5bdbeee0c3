"""finetune/reading.py: a family's examples as a run reads them, without jax."""

import ml_collections
import pytest

from electra_jax.errors import DataError
from electra_jax.finetune import reading, tasks
from tests.finetune.test_loop import _sst2
from tests.finetune.test_squad_data import write_squad


def test_training_set():
    task = tasks.get_task("MRPC")
    examples = [tasks.Example(f"a{i}", f"b{i}", i % 2, f"t:{i}") for i in range(10)]
    capped = reading.training_set(task, examples, 4, double_unordered=True)
    assert len(capped) == 8 and [e.text_a for e in capped[4:]] == [e.text_b for e in capped[:4]]
    assert capped[:4] == reading.training_set(task, examples, 4, double_unordered=False)
    assert len(reading.training_set(tasks.get_task("RTE"), examples, 0, True)) == 10


def _config(data_dir, max_train_examples=0):
    return ml_collections.ConfigDict(
        {
            "data_dir": str(data_dir),
            "tfds_data_dir": "",
            "max_train_examples": max_train_examples,
            "double_unordered": True,
        }
    )


def test_each_family_reads_its_training_set_dev_sets_and_texts(tmp_path):
    data = reading.READERS["glue"](
        _config(_sst2(tmp_path / "SST-2", n_train=10, n_dev=4), 6), tasks.get_task("SST-2")
    )
    assert (len(data.train), data.num_read, list(data.dev), len(data.dev["dev"])) == (
        6,
        10,
        ["dev"],
        4,
    )
    assert len(data.texts) == 10  # every training sentence, for a tokenizer of the task's own
    squad = write_squad(tmp_path / "squad", "2.0", n_train=3, n_dev=2)
    data = reading.READERS["squad"](_config(squad), "2.0")
    assert len(data.train) == data.num_read > 0 and list(data.dev) == ["dev"]
    assert reading.read_squad(_config(squad), "2.0", dev_only=True).train == []


def test_a_task_without_training_examples_is_one_line(tmp_path):
    empty = write_squad(tmp_path / "squad", "1.1", n_train=0, n_dev=2)
    with pytest.raises(DataError, match="train-v1.1.json has no questions"):
        reading.read_squad(_config(empty), "1.1")
    sst2 = _sst2(tmp_path / "SST-2", n_train=0, n_dev=2)
    with pytest.raises(DataError, match=r"train.tsv has no examples \(only a header row\)"):
        reading.read_glue(_config(sst2), tasks.get_task("SST-2"))
