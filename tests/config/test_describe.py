"""--print_config: every key, its value and its doc (the schema's, or its file's comment), for
train, prepare and finetune."""

import sys

import pytest

from electra_jax.config import describe
from electra_jax.config.schema import flatten
from tests import command_server
from tests.conftest import ROOT, load_config, subprocess_env


def test_comments_come_from_the_file_and_the_config_it_starts_from(tmp_path):
    base = tmp_path / "base.py"
    base.write_text(
        "import ml_collections\n"
        "def get_config():\n"
        "    config = ml_collections.ConfigDict()\n"
        "    config.train = ml_collections.ConfigDict()  # the schedule\n"
        "    config.train.steps = 10  # updates in all\n"
        "    # the peak, reached after\n"
        "    # the warm-up\n"
        "    config.train.lr = 0.1\n"
        "\n"
        "    config.train.plain = 1\n"
        "    return config\n"
    )
    child = tmp_path / "child.py"
    child.write_text(
        "import pathlib, runpy\n"
        "_base = runpy.run_path(str(pathlib.Path(__file__).with_name('base.py')))\n"
        "def get_config():\n"
        "    config = _base['get_config']()\n"
        "    config.train.steps = 3  # a short demo\n"
        "    return config\n"
    )
    comments = describe.file_comments(str(child))
    assert comments == {
        "train": "the schedule",
        "train.steps": "a short demo",
        "train.lr": "the peak, reached after the warm-up",
        "train.plain": "",
    }


@pytest.mark.parametrize(
    "name,family",
    [(n, False) for n in ("tiny", "small", "base", "large", "gpu_quality")]
    + [("glue", True), ("squad", True)],
)
def test_every_shipped_config_prints_as_recorded(name, family, monkeypatch):
    """tests/data/print_config/NAME.txt holds what `--print_config` printed for each config when
    the keys' docs moved from configs/*.py's comments into the schema: the same keys, values,
    order and docs (keys that had no comment gained their schema doc)."""
    monkeypatch.chdir(ROOT)
    config = load_config(name)
    expected = (ROOT / "tests" / "data" / "print_config" / f"{name}.txt").read_text()
    assert describe.describe(config, f"configs/{name}.py") + "\n" == expected
    assert ("family" in config) == family


def test_every_key_of_a_paper_config_is_printed_in_its_files_order():
    config = load_config("tiny")
    text = describe.describe(config, str(ROOT / "configs" / "tiny.py"))
    lines = text.splitlines()
    keys = [line.split(" = ")[0] for line in lines if not line.startswith("#")]
    assert sorted(keys) == sorted(flatten(config.to_dict()))
    assert keys[:2] == ["seed", "data.source"]  # the schema's order, not the alphabet's
    assert "data.vocab_size = 4096  # SentencePiece pieces" in text  # tiny's value, small's words
    assert "checkpoint.keep_every_steps = 0  # Also keep every checkpoint" in text
    assert "# model: the discriminator" in lines


@pytest.mark.parametrize(
    "module,config,key",
    [
        ("electra_jax.train", "configs/tiny.py", "train.num_steps"),
        ("electra_jax.prepare", "configs/tiny.py", "train.num_steps"),
        ("electra_jax.finetune", "configs/glue.py", "max_train_examples"),
    ],
)
def test_print_config_shows_the_overrides_and_needs_no_workdir(module, config, key):
    out = command_server.run(
        [sys.executable, "-m", module, f"--config={config}", f"--config.{key}=7", "--print_config"],
        cwd=ROOT,
        env=subprocess_env(),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"# {config}: every key")
    assert any(line.startswith(f"{key} = 7") for line in out.stdout.splitlines())


# Keys whose docs were rewritten on purpose after 2e04d7e, when what they describe changed
# (their key and value lines are still checked): model.attention gained the choices 'pallas'
# and 'auto'.
REWRITTEN_DOCS = {"model.attention"}
# Keys changed on purpose since 2e04d7e, with the change: their lines may differ from it.
CHANGED_SINCE_2E04D7E = {
    # More policies and 'auto' (the doc lists them); base and large default to 'auto'.
    "train.remat": ("none", "auto"),
    # 'auto' resolves to the Pallas kernel on TPU devices and to 'einsum' elsewhere.
    "model.attention": ("einsum", "auto"),
    # base and large compute in bfloat16 (benchmarks/notes/compile.md, "bfloat16 that pays").
    "model.dtype": ("float32", "bfloat16"),
}
# Keys added since 2e04d7e: their lines are new, the others' still compared.
ADDED_SINCE_2E04D7E = {"checkpoint.every_minutes", "export.license", "data.mixture"}
# Keys whose line moved on purpose since 2e04d7e (the line itself is still checked): GLUE's
# seq_length stands where SQuAD's does, the families' order derived from one declaration order.
MOVED_SINCE_2E04D7E = {"seq_length"}


@pytest.mark.parametrize("name", ["tiny", "small", "base", "large", "gpu_quality", "glue", "squad"])
def test_the_schema_kept_every_key_value_and_doc_print_config_had_before_it(name):
    """tests/data/print_config/2e04d7e/NAME.txt is `--print_config` at 2e04d7e, when the docs were
    configs/*.py's comments: the same lines in the same order now, each with the doc it had; a
    key that had none may have gained one (and SQuAD's joint_prediction its whole sentence), and
    the keys of REWRITTEN_DOCS another. The keys of CHANGED_SINCE_2E04D7E keep their place, with
    one of the values listed; those of MOVED_SINCE_2E04D7E keep their line, not their place; the
    keys of ADDED_SINCE_2E04D7E are left out."""
    folder = ROOT / "tests" / "data" / "print_config"
    before = (folder / "2e04d7e" / f"{name}.txt").read_text().splitlines()
    now = [
        line
        for line in (folder / f"{name}.txt").read_text().splitlines()
        if line.partition(" = ")[0] not in ADDED_SINCE_2E04D7E
    ]
    moved = [line for line in before if line.partition(" = ")[0] in MOVED_SINCE_2E04D7E]
    assert moved == [line for line in now if line.partition(" = ")[0] in MOVED_SINCE_2E04D7E]
    before, now = ([ln for ln in lines if ln not in moved] for lines in (before, now))
    assert len(before) == len(now)
    for old, new in zip(before[1:], now[1:], strict=True):
        old_line, _, old_doc = old.partition("  # ")
        new_line, _, new_doc = new.partition("  # ")
        key = old_line.partition(" = ")[0]
        if key in CHANGED_SINCE_2E04D7E:
            assert new_line.partition(" = ")[0] == key
            assert new_line.partition(" = ")[2] in map(repr, CHANGED_SINCE_2E04D7E[key])
            continue
        assert new_line == old_line
        grew = old_doc.endswith(":") and new_doc.startswith(old_doc)
        rewritten = new_line.split(" = ")[0] in REWRITTEN_DOCS
        assert new_doc == old_doc or not old_doc or grew or rewritten, (old, new)
