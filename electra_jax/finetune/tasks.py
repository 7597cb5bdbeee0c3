"""The GLUE tasks: what each one reads, from the GLUE TSV files or from TFDS.

A task is a sentence or a sentence pair with a class (or, for STS-B, a similarity score). The TSV
files are the ones GLUE's download script writes: a header row naming the columns (MRPC's files
start with a UTF-8 byte-order mark), except CoLA's train and dev files, which have no header and
four columns (source, label, original label, sentence). Fields are separated by tabs and never
quoted: sentences contain lone double quotes, so the files must be read with quoting disabled.

Labels become integer classes in the order of `Task.labels`; TFDS stores the same labels as
integers in its own order, which `Task.tfds_labels` maps back to the TSV spelling. A score (STS-B)
must be a finite number within `Task.score_range`; either reader rejects any other label, naming
the file and line (or the TFDS example).
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import math
import os
from collections.abc import Sequence

from electra_jax.errors import DataError
from electra_jax.store import deadline, jsonio, paths


@dataclasses.dataclass(frozen=True)
class Split:
    """One dev (or train) set of a task: where it lives in the TSV directory and in TFDS."""

    name: str  # 'dev', 'dev_matched', 'dev_mismatched', 'train'
    filename: str  # e.g. 'dev_matched.tsv'
    tfds_split: str  # e.g. 'validation_matched'


@dataclasses.dataclass(frozen=True)
class Task:
    """How to read one GLUE task and how to score it.

    text_columns / label_column name header columns; for a headerless file (CoLA) they are
    column indices given as strings ('3') and `num_columns` fixes the row width.
    """

    name: str
    tfds_name: str
    text_columns: tuple[str, ...]  # one (single sentence) or two (a pair) columns
    label_column: str
    labels: tuple[str, ...]  # class labels as written in the TSV; () for regression (STS-B)
    tfds_text: tuple[str, ...]  # the TFDS features holding the texts, same order
    tfds_labels: tuple[str, ...] = ("0", "1")  # TSV label of TFDS's class 0, 1, ...
    dev_splits: tuple[Split, ...] = (Split("dev", "dev.tsv", "validation"),)
    headerless: bool = False
    num_columns: int = 0  # headerless files only
    num_epochs: float = 3.0  # the original ELECTRA's fine-tuning epochs
    double_unordered: bool = False  # train on (a, b) and (b, a): a symmetric relation
    score: str = "accuracy"  # the headline metric the ELECTRA paper reports
    score_range: tuple[float, float] = (0.0, 0.0)  # regression only: the scores' valid range

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_outputs(self) -> int:
        return 1 if self.is_regression else len(self.labels)


TRAIN = Split("train", "train.tsv", "train")
_ENTAILMENT = ("entailment", "not_entailment")

TASKS: dict[str, Task] = {
    t.name: t
    for t in (
        Task(
            "CoLA",
            "glue/cola",
            ("3",),
            "1",
            ("0", "1"),
            ("sentence",),
            headerless=True,
            num_columns=4,
            score="mcc",
        ),
        Task("SST-2", "glue/sst2", ("sentence",), "label", ("0", "1"), ("sentence",)),
        Task(
            "MRPC",
            "glue/mrpc",
            ("#1 String", "#2 String"),
            "Quality",
            ("0", "1"),
            ("sentence1", "sentence2"),
            double_unordered=True,
        ),
        Task(
            "STS-B",
            "glue/stsb",
            ("sentence1", "sentence2"),
            "score",
            (),
            ("sentence1", "sentence2"),
            tfds_labels=(),
            num_epochs=10.0,
            double_unordered=True,
            score="spearman",
            score_range=(0.0, 5.0),  # GLUE's similarity scale
        ),
        Task(
            "QQP",
            "glue/qqp",
            ("question1", "question2"),
            "is_duplicate",
            ("0", "1"),
            ("question1", "question2"),
        ),
        Task(
            "MNLI",
            "glue/mnli",
            ("sentence1", "sentence2"),
            "gold_label",
            ("contradiction", "entailment", "neutral"),
            ("premise", "hypothesis"),
            tfds_labels=("entailment", "neutral", "contradiction"),
            dev_splits=(
                Split("dev_matched", "dev_matched.tsv", "validation_matched"),
                Split("dev_mismatched", "dev_mismatched.tsv", "validation_mismatched"),
            ),
        ),
        Task(
            "QNLI",
            "glue/qnli",
            ("question", "sentence"),
            "label",
            _ENTAILMENT,
            ("question", "sentence"),
            tfds_labels=_ENTAILMENT,
        ),
        Task(
            "RTE",
            "glue/rte",
            ("sentence1", "sentence2"),
            "label",
            _ENTAILMENT,
            ("sentence1", "sentence2"),
            tfds_labels=_ENTAILMENT,
            num_epochs=10.0,
        ),
        Task(
            "WNLI",
            "glue/wnli",
            ("sentence1", "sentence2"),
            "label",
            ("0", "1"),
            ("sentence1", "sentence2"),
        ),
    )
}


def _key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def get_task(name: str) -> Task:
    """The task called `name` ('SST-2'; case and hyphens do not matter: 'sst2' works too).

    Raises:
      DataError: no GLUE task has that name (the message lists them).
    """
    for task in TASKS.values():
        if _key(task.name) == _key(name):
            return task
    raise DataError(
        f"config.task={name!r} is not a GLUE task; use one of {', '.join(TASKS)} "
        "(e.g. --config.task=SST-2)"
    )


@dataclasses.dataclass(frozen=True)
class Example:
    """One example: its texts, its label (class index, or score for regression) and where from."""

    text_a: str
    text_b: str | None
    label: int | float
    source: str  # 'FILE:LINE' or 'tfds:NAME/SPLIT[i]', for the predictions file and errors


def _score(task: Task, raw, where: str) -> float:
    """A regression label: a finite number within the task's range, else DataError."""
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise DataError(
            f"{where}: label {raw!r} is not a number ({task.name} scores are floats); "
            "fix or remove that line"
        ) from None
    low, high = task.score_range
    if not (math.isfinite(value) and low <= value <= high):
        shown = repr(raw) if isinstance(raw, str) else f"{value:g}"  # TFDS gives numbers
        raise DataError(
            f"{where}: score {shown} is outside {task.name}'s range [{low:g}, {high:g}]; "
            "fix or remove that line"
        )
    return value


def _label(task: Task, raw: str, where: str) -> int | float:
    if task.is_regression:
        return _score(task, raw, where)
    try:
        return task.labels.index(raw)
    except ValueError:
        raise DataError(
            f"{where}: label {raw!r} is not one of {list(task.labels)} for {task.name}; "
            "fix or remove that line, or check that the file is the task's"
        ) from None


def _tfds_label(task: Task, raw, where: str) -> int | float:
    """A TFDS label (a score, or a class index in TFDS's order) -> the task's label."""
    if task.is_regression:
        return _score(task, raw, where)
    index = int(raw)
    if not 0 <= index < len(task.tfds_labels):  # GLUE's test splits store -1: no label
        raise DataError(
            f"{where}: label {index} is not a class of {task.name} (0 to "
            f"{len(task.tfds_labels) - 1}); is this a split with labels?"
        )
    return task.labels.index(task.tfds_labels[index])


# The longest TSV field read (characters). csv's default of 131,072 refuses legitimate long
# sentences and paragraphs (a 300,000-character one was seen); with quoting off a field cannot
# run away across lines, so the limit only bounds a line, and fine-tuning cuts every example to
# config.seq_length tokens anyway.
MAX_TSV_FIELD_CHARS = 1 << 26


def read_tsv(path: str) -> list[list[str]]:
    """Rows of a GLUE TSV file: tab-separated, no quoting, UTF-8 with or without a BOM.

    Blank lines (a trailing newline, an empty last line) are dropped.

    Raises:
      DataError: the file cannot be read or is not UTF-8.
    """
    # The limit is the csv module's, process-wide: raised for this read, then given back.
    limit = csv.field_size_limit(MAX_TSV_FIELD_CHARS)
    try:
        # newline='' leaves line ends to the csv module; 'utf-8-sig' drops a leading BOM.
        with open(path, encoding="utf-8-sig", newline="") as f:
            rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    except csv.Error as e:
        if "field limit" not in str(e):
            raise DataError(f"{path} is not a tab-separated file ({e})") from None
        raise DataError(
            f"{path} has a field of more than {MAX_TSV_FIELD_CHARS:,} characters, the longest "
            "a TSV field is read (finetune/tasks.py's MAX_TSV_FIELD_CHARS); check that the file "
            "is tab-separated, or cut that text"
        ) from None
    except OSError as e:
        raise DataError(f"{path} cannot be read ({e.strerror}); check config.data_dir") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{path} cannot be read: {jsonio.text_problem(e)}") from None
    finally:
        csv.field_size_limit(limit)
    return [r for r in rows if r and any(field.strip() for field in r)]


def examples_from_rows(task: Task, rows: Sequence[list[str]], path: str) -> list[Example]:
    """Rows of one of the task's TSV files (header first unless headerless) -> examples.

    Raises:
      DataError: a missing header column, a row of the wrong width, or a bad label; the
        message names the file and line.
    """
    if task.headerless:
        width = task.num_columns
        text_idx = [int(c) for c in task.text_columns]
        label_idx = int(task.label_column)
        start = 0
    else:
        if not rows:
            raise DataError(f"{path} is empty; expected a header row and examples")
        header = [h.strip() for h in rows[0]]
        missing = [c for c in (*task.text_columns, task.label_column) if c not in header]
        if missing:
            raise DataError(
                f"{path} line 1: the header has no column {missing[0]!r} (found "
                f"{header[:6]}); is this {task.name}'s file?"
            )
        width = len(header)
        text_idx = [header.index(c) for c in task.text_columns]
        label_idx = header.index(task.label_column)
        start = 1
    examples = []
    for line, row in enumerate(rows[start:], start=start + 1):
        where = f"{path} line {line}"
        if len(row) != width:
            raise DataError(
                f"{where}: {len(row)} tab-separated fields, expected {width} as in {task.name}'s "
                "GLUE files; fix or remove that line"
            )
        texts = [row[i].strip() for i in text_idx]
        label = _label(task, row[label_idx].strip(), where)
        b = texts[1] if len(texts) > 1 else None
        examples.append(Example(texts[0], b, label, f"{os.path.basename(path)}:{line}"))
    return examples


def task_dir(task: Task, data_dir: str) -> str:
    """The directory holding the task's TSVs: data_dir itself, or data_dir/<task> (GLUE's root)."""
    if not os.path.isdir(data_dir):
        raise DataError(
            f"config.data_dir={data_dir!r} is not a directory; point it at the {task.name} "
            "TSV files (GLUE's download script writes them to glue_data/" + task.name + ")"
        )
    nested = os.path.join(data_dir, task.name)
    if not os.path.exists(os.path.join(data_dir, TRAIN.filename)) and os.path.isdir(nested):
        return nested
    return data_dir


def tsv_path(task: Task, data_dir: str, split: Split) -> str:
    """The TSV file of one split of the task; DataError naming it when it is not there."""
    path = os.path.join(task_dir(task, data_dir), split.filename)
    if not os.path.isfile(path):
        raise DataError(
            f"{path} does not exist; config.data_dir must hold {task.name}'s "
            f"{', '.join(s.filename for s in (TRAIN, *task.dev_splits))}"
        )
    return path


def check_tsv_files(task: Task, data_dir: str) -> None:
    """DataError naming the first TSV of the task (train and dev splits) that data_dir lacks:
    for a caller that runs several tasks, before the first run rather than after it."""
    for split in (TRAIN, *task.dev_splits):
        tsv_path(task, data_dir, split)


def read_tsv_split(task: Task, data_dir: str, split: Split) -> list[Example]:
    """The examples of one split from the task's directory of GLUE TSVs."""
    path = tsv_path(task, data_dir, split)
    return examples_from_rows(task, read_tsv(path), path)


def _import_tfds(task: Task):
    try:
        import tensorflow_datasets as tfds

        # TFDS registers GLUE only once its module is imported (it is skipped in the lazy
        # registry when TensorFlow is absent), so import it by name.
        import tensorflow_datasets.text.glue  # noqa: F401
    except ImportError:
        raise DataError(
            f"config.data_dir is empty, so {task.name} is read from TFDS, which needs "
            "tensorflow-datasets: pip install -e '.[tfds]', or set config.data_dir to the "
            "GLUE TSV files"
        ) from None
    return tfds


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def read_tfds_split(task: Task, split: Split, tfds_data_dir: str = "") -> list[Example]:
    """The examples of one split from TFDS (prepared in ArrayRecord format, read without TF).

    Raises:
      DataError: tensorflow-datasets is missing or the dataset is not prepared (the message
        gives the `tfds build` command), or a label is not one of the task's (named by its
        example, tfds:NAME/SPLIT[i]).
    """
    tfds = _import_tfds(task)
    where = tfds_data_dir or "~/tensorflow_datasets"
    build = f"tfds build {task.tfds_name} --file_format=array_record" + (
        f" --data_dir={tfds_data_dir}" if tfds_data_dir else ""
    )
    # TFDS logs a warning for each version folder it probes and finds empty; the error below
    # says all of that in one line.
    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    absl_logger.setLevel(logging.ERROR)
    # TFDS reads a gs:// data_dir itself (through etils.epath): its requests' deadline first.
    paths.bound(tfds_data_dir)
    try:
        source = tfds.data_source(
            task.tfds_name,
            split=split.tfds_split,
            data_dir=tfds_data_dir or None,
            download=False,
        )
    except Exception as e:  # not prepared, prepared as TFRecord, a TFDS without GLUE, ...
        if deadline.is_timeout(e):  # a gs:// data_dir that stopped answering
            raise DataError(
                f"config.tfds_data_dir {tfds_data_dir}: {deadline.no_answer_line(e)}"
            ) from None
        try:
            prepared = tfds.builder(task.tfds_name, data_dir=tfds_data_dir or None).is_prepared()
        except Exception:
            prepared = True  # the first error says more than the builder's
        if not prepared:
            raise DataError(
                f"TFDS dataset {task.tfds_name} is not prepared in {where} and is not "
                f"downloaded here; prepare it with: {build} (or set config.data_dir to the GLUE "
                "TSV files)"
            ) from None
        if isinstance(e, NotImplementedError):  # TFRecord files have no random access
            raise DataError(
                f"TFDS dataset {task.tfds_name} in {where} is stored as TFRecord; rebuild it "
                f"with: {build}"
            ) from None
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise DataError(f"TFDS cannot read {task.tfds_name}/{split.tfds_split} ({first})") from None
    finally:
        absl_logger.setLevel(level)
    examples = []
    for i in range(len(source)):
        row = source[i]
        texts = [_text(row[f]) for f in task.tfds_text]
        where = f"tfds:{task.tfds_name}/{split.tfds_split}[{i}]"
        label = _tfds_label(task, row["label"], where)
        b = texts[1] if len(texts) > 1 else None
        examples.append(Example(texts[0], b, label, where))
    return examples


def load_split(task: Task, split: Split, data_dir: str, tfds_data_dir: str = "") -> list[Example]:
    """The split's examples from the TSVs in data_dir, or from TFDS when data_dir is empty.

    Raises:
      DataError: what the readers raise, and a split without a single example (a file with
        only its header): a dev set of none would be scored 0 and written as a result, a
        training set of none trains nothing.
    """
    if data_dir:
        examples = read_tsv_split(task, data_dir, split)
        where = os.path.join(task_dir(task, data_dir), split.filename)
    else:
        examples = read_tfds_split(task, split, tfds_data_dir)
        where = f"tfds:{task.tfds_name}/{split.tfds_split}"
    if not examples:
        raise DataError(
            f"{where} has no examples{'' if task.headerless else ' (only a header row)'}; "
            f"give {task.name}'s full {split.name} set in config.data_dir"
        )
    return examples


def label_text(task: Task, label: int | float) -> str | float:
    """A class index as the TSV writes it (a score stays a float)."""
    return float(label) if task.is_regression else task.labels[int(label)]
