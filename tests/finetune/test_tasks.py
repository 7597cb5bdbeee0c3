"""GLUE readers: every TSV layout (header, BOM, headerless CoLA, MNLI's two dev sets), bad rows,
the TFDS path, and the real files in /work/shared/data/glue when they are there."""

import types

import numpy as np
import pytest

from electra_jax.errors import DataError
from electra_jax.finetune import tasks
from tests.conftest import SHARED

GLUE = SHARED / "data" / "glue"


def _write(path, lines, bom=False):
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(line + "\n" for line in lines)
    path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + text.encode("utf-8"))
    return path


def test_task_names_are_forgiving_and_unknown_ones_listed():
    assert tasks.get_task("sst2").name == "SST-2"
    assert tasks.get_task("sts-b").name == "STS-B"
    assert tasks.get_task("mnli").dev_splits[1].filename == "dev_mismatched.tsv"
    with pytest.raises(DataError, match=r"config.task='SST3' is not a GLUE task; use one of CoLA"):
        tasks.get_task("SST3")


def test_headerless_cola(tmp_path):
    _write(
        tmp_path / "train.tsv",
        ["gj04\t1\t\tThe sailors rode the breeze.", 'cj99\t0\t*\tHe said "so much the.'],
    )
    ex = tasks.read_tsv_split(tasks.get_task("CoLA"), str(tmp_path), tasks.TRAIN)
    assert [(e.text_a, e.text_b, e.label) for e in ex] == [
        ("The sailors rode the breeze.", None, 1),
        ('He said "so much the.', None, 0),  # a lone quote is text: quoting is off
    ]
    assert ex[1].source == "train.tsv:2"


def test_mrpc_with_bom_and_quotes(tmp_path):
    _write(
        tmp_path / "dev.tsv",
        [
            "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
            '1\t1\t2\tHe said "the pie\tThe pie" was fine.',
            "0\t3\t4\tA b.\tC d.",
        ],
        bom=True,
    )
    task = tasks.get_task("MRPC")
    ex = tasks.read_tsv_split(task, str(tmp_path), task.dev_splits[0])
    assert [(e.text_a, e.text_b, e.label) for e in ex] == [
        ('He said "the pie', 'The pie" was fine.', 1),
        ("A b.", "C d.", 0),
    ]


def test_mnli_matched_and_mismatched_and_nested_dir(tmp_path):
    header = (
        "index\tpromptID\tpairID\tgenre\ts1b\ts2b\ts1p\ts2p\tsentence1\tsentence2\tlabel1\t"
        "gold_label"
    )
    root = tmp_path / "glue"
    for name, label in (("dev_matched.tsv", "neutral"), ("dev_mismatched.tsv", "contradiction")):
        _write(root / "MNLI" / name, [header, f"0\t1\t2\tg\t.\t.\t.\t.\tP.\tH.\t{label}\t{label}"])
    task = tasks.get_task("MNLI")
    # data_dir may be GLUE's root: the task's own directory is found inside it.
    m, mm = (tasks.read_tsv_split(task, str(root), s) for s in task.dev_splits)
    assert (m[0].text_a, m[0].text_b, m[0].label) == ("P.", "H.", 2)
    assert mm[0].label == task.labels.index("contradiction") == 0


@pytest.mark.parametrize(
    "name,lines,expected",
    [
        ("SST-2", ["sentence\tlabel", "a fine film \t1"], ("a fine film", None, 1)),
        (
            "STS-B",
            [
                "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
                "\tscore",
                "0\tmain\tf\t2012\t0\tnone\tnone\tA man.\tA guy.\t4.750",
            ],
            ("A man.", "A guy.", 4.75),
        ),
        (
            "QQP",
            ["id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate", "5\t1\t2\tWhy?\tHow?\t1"],
            ("Why?", "How?", 1),
        ),
        (
            "QNLI",
            ["index\tquestion\tsentence\tlabel", "0\tWho?\tHim.\tnot_entailment"],
            ("Who?", "Him.", 1),
        ),
        ("RTE", ["index\tsentence1\tsentence2\tlabel", "0\tA.\tB.\tentailment"], ("A.", "B.", 0)),
        ("WNLI", ["index\tsentence1\tsentence2\tlabel", "0\tA.\tB.\t1"], ("A.", "B.", 1)),
    ],
)
def test_header_formats(tmp_path, name, lines, expected):
    _write(tmp_path / "train.tsv", lines)
    (ex,) = tasks.read_tsv_split(tasks.get_task(name), str(tmp_path), tasks.TRAIN)
    assert (ex.text_a, ex.text_b, ex.label) == expected


@pytest.mark.parametrize(
    "name,lines,expected",
    [
        ("SST-2", ["sentence\tlabel", "good\t1", "bad"], r"train.tsv line 3: 1 tab-separated"),
        ("SST-2", ["sentence\tlabel", "good\t2"], r"line 2: label '2' is not one of \['0', '1'\]"),
        ("SST-2", ["text\tlabel", "good\t1"], r"line 1: the header has no column 'sentence'"),
        ("CoLA", ["gj04\t1\t\tok", "gj04\t1\tok"], r"line 2: 3 tab-separated fields, expected 4"),
        (
            "STS-B",
            ["sentence1\tsentence2\tscore", "A\tB\thigh"],
            r"line 2: label 'high' is not a number",
        ),
        # Scores are finite and on GLUE's 0-5 scale.
        *(
            (
                "STS-B",
                ["sentence1\tsentence2\tscore", "A\tB\t2.5", f"A\tB\t{bad}"],
                rf"train.tsv line 3: score '{bad}' is outside STS-B's range \[0, 5\]",
            )
            for bad in ("5.2", "-0.1", "nan", "inf", "-inf")
        ),
        ("RTE", [], r"train.tsv is empty"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, name, lines, expected):
    _write(tmp_path / "train.tsv", lines)
    with pytest.raises(DataError, match=expected):
        tasks.read_tsv_split(tasks.get_task(name), str(tmp_path), tasks.TRAIN)


def test_missing_dir_and_file(tmp_path):
    task = tasks.get_task("QNLI")
    with pytest.raises(DataError, match=r"config.data_dir='.*nope' is not a directory"):
        tasks.read_tsv_split(task, str(tmp_path / "nope"), tasks.TRAIN)
    with pytest.raises(DataError, match=r"train.tsv does not exist; .* QNLI's train.tsv, dev.tsv"):
        tasks.read_tsv_split(task, str(tmp_path), tasks.TRAIN)
    _write(tmp_path / "train.tsv", ["sentence\tlabel"])
    (tmp_path / "dev.tsv").write_bytes(b"sentence\tlabel\n\xff\xfe\t1\n")
    sst = tasks.get_task("SST-2")
    with pytest.raises(DataError, match=r"dev.tsv cannot be read: it is not UTF-8 text \("):
        tasks.read_tsv_split(sst, str(tmp_path), sst.dev_splits[0])
    # Saved as UTF-16 (Windows' "Unicode"): named as such, with the way out.
    (tmp_path / "dev.tsv").write_text("sentence\tlabel\nfine\t1\n", encoding="utf-16")
    with pytest.raises(DataError) as e:
        tasks.read_tsv_split(sst, str(tmp_path), sst.dev_splits[0])
    assert str(e.value) == (
        f"{tmp_path / 'dev.tsv'} cannot be read: it is UTF-16 text (its byte-order mark), not "
        "UTF-8: convert it, e.g. iconv -f UTF-16 -t UTF-8"
    )


@pytest.mark.skipif(not GLUE.is_dir(), reason=f"GLUE TSVs not found at {GLUE}")
def test_shared_glue_files():
    counts = {
        "CoLA": (8551, 1043),
        "MRPC": (3668, 408),
        "RTE": (2490, 277),
        "SST-2": (67349, 872),
        "STS-B": (5749, 1500),
        "WNLI": (635, 71),
    }
    for name, (n_train, n_dev) in counts.items():
        task = tasks.get_task(name)
        train = tasks.read_tsv_split(task, str(GLUE), tasks.TRAIN)
        dev = tasks.read_tsv_split(task, str(GLUE), task.dev_splits[0])
        assert (len(train), len(dev)) == (n_train, n_dev), name
    mrpc = tasks.read_tsv_split(tasks.get_task("MRPC"), str(GLUE / "MRPC"), tasks.TRAIN)
    assert mrpc[0].text_a.startswith("Amrozi accused his brother")  # the BOM is gone
    qnli = tasks.get_task("QNLI")
    assert len(tasks.read_tsv_split(qnli, str(GLUE), qnli.dev_splits[0])) == 5463


@pytest.mark.parametrize(
    "name,labels,expected",
    [
        ("STS-B", [4.5, 0.0, 5.0], [4.5, 0.0, 5.0]),
        ("MNLI", [0, 2], [1, 0]),  # TFDS's entailment, contradiction
        ("STS-B", [4.5, 5.5], r"stsb/train\[1\]: score 5.5 is outside STS-B's range \[0, 5\]"),
        ("STS-B", [float("nan")], r"stsb/train\[0\]: score nan is outside STS-B's range"),
        ("STS-B", [1.0, float("inf")], r"stsb/train\[1\]: score inf is outside"),
        ("STS-B", [-1.0], r"stsb/train\[0\]: score -1 is outside"),
        ("SST-2", [1, -1], r"sst2/train\[1\]: label -1 is not a class of SST-2 \(0 to 1\)"),
        ("MNLI", [3], r"mnli/train\[0\]: label 3 is not a class of MNLI \(0 to 2\)"),
    ],
)
def test_tfds_labels_are_checked(monkeypatch, name, labels, expected):
    """TFDS rows go through the same checks as TSV rows, named by their example."""
    task = tasks.get_task(name)
    as_stored = np.float32 if task.is_regression else np.int64  # TFDS's label dtypes
    rows = [{**{f: b"A text." for f in task.tfds_text}, "label": as_stored(y)} for y in labels]
    fake = types.SimpleNamespace(data_source=lambda *args, **kwargs: rows)
    monkeypatch.setattr(tasks, "_import_tfds", lambda task: fake)
    if isinstance(expected, str):
        with pytest.raises(DataError, match=expected):
            tasks.read_tfds_split(task, tasks.TRAIN)
    else:
        assert [e.label for e in tasks.read_tfds_split(task, tasks.TRAIN)] == expected


def test_tfds_examples_and_unprepared_dataset(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets", reason="tensorflow-datasets not installed")
    task = tasks.get_task("MNLI")
    with tfds.testing.mock_data(num_examples=4, policy=tfds.testing.MockPolicy.USE_CODE):
        ex = tasks.load_split(task, task.dev_splits[1], data_dir="")
    assert len(ex) == 4 and all(isinstance(e.text_a, str) and e.label in (0, 1, 2) for e in ex)
    assert ex[0].source == "tfds:glue/mnli/validation_mismatched[0]"
    with pytest.raises(DataError, match=r"glue/rte is not prepared .* tfds build glue/rte"):
        tasks.load_split(tasks.get_task("RTE"), tasks.TRAIN, "", str(tmp_path / "tfds"))


@pytest.mark.parametrize("empty", ["train.tsv", "dev.tsv"])
def test_a_split_of_a_header_and_no_examples_is_refused_naming_the_file(tmp_path, empty):
    """Never scored 0.0 and written as a result (a dev set), never trained on (a train set):
    through the command, before the tokenizer or any step."""
    from tests.conftest import error_line, run_command

    glue = tmp_path / "SST-2"
    for name in ("train.tsv", "dev.tsv"):
        rows = [] if name == empty else ["the river ran\t1", "the king spoke\t0"]
        _write(glue / name, ["sentence\tlabel", *rows])
    out = run_command(
        "electra_jax.finetune",
        "--config=configs/glue.py",
        f"--config.data_dir={glue}",
        f"--workdir={tmp_path / 'run'}",
    )
    assert error_line(out) == (
        f"error: {glue / empty} has no examples (only a header row); give SST-2's full "
        f"{empty[:-4]} set in config.data_dir"
    )
    assert not (tmp_path / "run" / "eval_results.json").exists()


def test_an_empty_headerless_split_is_refused_too(tmp_path):
    _write(tmp_path / "train.tsv", ["gj04\t1\t\tThe sailors rode the breeze."])
    _write(tmp_path / "dev.tsv", [])
    cola = tasks.get_task("CoLA")
    assert len(tasks.load_split(cola, tasks.TRAIN, str(tmp_path))) == 1
    with pytest.raises(DataError, match=r"dev.tsv has no examples; give CoLA's full dev set"):
        tasks.load_split(cola, cola.dev_splits[0], str(tmp_path))


def test_a_long_sentence_is_read_and_a_field_past_our_limit_is_named(tmp_path, monkeypatch):
    """csv's own field limit (131,072) is no limit of ours: a 300,000-character sentence reads.
    Ours (MAX_TSV_FIELD_CHARS) is named when passed, and csv's process-wide limit is given back."""
    import csv

    before = csv.field_size_limit()
    long = "word " * 60_000
    _write(tmp_path / "train.tsv", ["sentence\tlabel", f"{long}\t1", "short\t0"])
    rows = tasks.read_tsv(str(tmp_path / "train.tsv"))
    assert rows[1] == [long, "1"] and len(rows) == 3
    assert csv.field_size_limit() == before
    monkeypatch.setattr(tasks, "MAX_TSV_FIELD_CHARS", 1000)
    with pytest.raises(DataError) as e:
        tasks.read_tsv(str(tmp_path / "train.tsv"))
    assert str(e.value) == (
        f"{tmp_path / 'train.tsv'} has a field of more than 1,000 characters, the longest a TSV "
        "field is read (finetune/tasks.py's MAX_TSV_FIELD_CHARS); check that the file is "
        "tab-separated, or cut that text"
    )
    assert csv.field_size_limit() == before
