"""End to end on the builtin corpus with the micro model: train, log, checkpoint, resume."""

import json
import math
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from electra_jax.model import layer_stack
from electra_jax.objectives import core
from electra_jax.pretraining import metrics, optimizer_step, runner
from tests.conftest import built_once, micro_config

FIELDS = {
    "step",
    "loss",
    "gen_loss",
    "disc_loss",
    "gen_accuracy",
    "disc_accuracy",
    "replaced_fraction",
    "learning_rate",
    "grad_norm",
    "tokens_per_sec",
    "mfu",
    "elapsed_sec",
}


_SHARED: dict = {}


def prepare_shared_data(tmp_path_factory) -> tuple[str, str]:
    """(tokenizer path, cache dir) of the micro config, made once per test run for all modules
    and workers (a one-step run trains the tokenizer and prepares the shards)."""
    if "paths" not in _SHARED:
        root = built_once(tmp_path_factory, "micro-data", _train_one_step)
        _SHARED["paths"] = (str(root / "first" / "tokenizer" / "spm.model"), str(root / "cache"))
    return _SHARED["paths"]


def _train_one_step(root) -> None:
    cfg = micro_config()
    cfg.data.cache_dir = str(root / "cache")
    # Stopped after one step of the micro run's 6 rather than a run of 1 (train.num_steps is
    # part of the program): the step it compiles is the one most tests run.
    runner.train(cfg, str(root / "first"), stop_after=1)


@pytest.fixture(scope="module")
def shared_data(tmp_path_factory):
    """Tokenizer and prepared shards made once, reused through data.tokenizer / data.cache_dir."""
    return prepare_shared_data(tmp_path_factory)


def config_with(shared_data):
    """The micro config reading the shared tokenizer and prepared data."""
    cfg = micro_config()
    cfg.data.tokenizer, cfg.data.cache_dir = shared_data
    return cfg


@pytest.mark.slow
def test_train_writes_the_workdir_and_resumes_exactly(shared_data, tmp_path, capsys):
    cfg = config_with(shared_data)
    straight = tmp_path / "straight"
    last = runner.train(cfg, str(straight))
    rows = metrics.read_rows(str(straight / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert set(rows[0]) >= FIELDS
    assert rows[0]["mfu"] is None  # no known peak for a CPU
    assert last["loss"] == rows[-1]["loss"]
    assert json.loads((straight / "config.json").read_text())["model"]["hidden_size"] == 64
    assert sorted(os.listdir(straight / "checkpoints")) == ["3", "6"]
    assert os.listdir(straight / "tensorboard")

    # Stop at step 4 (checkpoint 3 and 4 exist), then the same call finishes the run.
    capsys.readouterr()
    resumed = tmp_path / "resumed"
    runner.train(cfg, str(resumed), stop_after=4)
    runner.train(cfg, str(resumed))
    again = metrics.read_rows(str(resumed / "metrics.jsonl"))
    assert [r["step"] for r in again] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(rows, again, strict=True):
        for k in ("loss", "gen_loss", "disc_loss", "grad_norm", "gen_accuracy"):
            assert a[k] == b[k], (a["step"], k)
    # Both later calls ran the step the first one compiled (program.setup_step), no other.
    err = capsys.readouterr().err
    assert err.count("reusing the train step compiled earlier in this process") == 2, err
    assert "compiled the train step" not in err
    assert "compile_sec" in again[0] and "compile_sec" in again[4]


def test_a_finished_run_run_again_says_that_nothing_was_trained(shared_data, tmp_path, capsys):
    """Exit 0 (the run is done, as asked), but never silent; the workdir is left as it was."""
    cfg = config_with(shared_data)  # the micro run's 6 steps: the suite's most shared program
    workdir = tmp_path / "w"
    runner.train(cfg, str(workdir))
    before = {p: p.read_bytes() for p in (workdir / "checkpoints").rglob("*") if p.is_file()}
    rows = metrics.read_rows(str(workdir / "metrics.jsonl"))
    capsys.readouterr()
    assert runner.train(cfg, str(workdir)) == {}
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        f"the run in {workdir} is already at step 6 (train.num_steps=6): nothing was trained; "
        "raise train.num_steps above 6 to go on"
    )
    assert "compiled" not in err
    assert metrics.read_rows(str(workdir / "metrics.jsonl")) == rows
    after = {p: p.read_bytes() for p in (workdir / "checkpoints").rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.slow
def test_resume_drops_rows_logged_after_the_last_checkpoint(shared_data, tmp_path):
    cfg = config_with(shared_data)
    workdir = tmp_path / "w"
    runner.train(cfg, str(workdir), stop_after=3)
    # A crash after step 3 could have logged steps 4-5 without checkpointing them.
    with open(workdir / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 4, "loss": -1.0}) + "\n")
        f.write('{"step": 5, "lo')  # torn last line
    runner.train(cfg, str(workdir))
    rows = metrics.read_rows(str(workdir / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows[3]["loss"] != -1.0


@pytest.mark.slow
def test_nan_stops_the_run_naming_the_step_and_the_last_good_checkpoint(shared_data, tmp_path):
    cfg = config_with(shared_data)
    cfg.train.debug_nan_at_step = 4  # the update of step 5 is NaN
    cfg.log.every_steps = 2
    workdir = tmp_path / "w"
    with pytest.raises(runner.NonFiniteError) as e:
        runner.train(cfg, str(workdir))
    message = str(e.value)
    assert "at step 5 (found checking steps 5-6" in message, message
    assert f"last good checkpoint: {workdir / 'checkpoints' / '3'}" in message
    assert "nan_policy='skip'" in message
    # Checkpoint 6 (due at step 6) was never written: its state descends from the NaN update.
    assert sorted(os.listdir(workdir / "checkpoints")) == ["3"]
    assert [r["step"] for r in metrics.read_rows(str(workdir / "metrics.jsonl"))] == [2, 4]


@pytest.mark.slow
def test_nan_policy_skip_keeps_the_state_and_counts_the_skip(shared_data, tmp_path):
    cfg = config_with(shared_data)
    cfg.train.nan_policy = "skip"
    cfg.train.debug_nan_at_step = 4
    cfg.checkpoint.every_steps, cfg.checkpoint.keep = 1, 10
    workdir = tmp_path / "w"
    runner.train(cfg, str(workdir))
    rows = metrics.read_rows(str(workdir / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["skipped_updates"] for r in rows] == [0, 0, 0, 0, 1, 0]
    assert math.isnan(rows[4]["loss"])
    assert math.isfinite(rows[5]["loss"]) and math.isfinite(rows[5]["grad_norm"])

    def saved(step):
        path = workdir / "checkpoints" / str(step) / "state"
        return ocp.StandardCheckpointer().restore(path)

    after4, after5, after6 = saved(4), saved(5), saved(6)
    # The skipped update kept params and optimizer state but still counted the step.
    assert int(after5["step"]) == 5
    for part in ("params", "opt_state"):
        a, b, c = (jax.tree_util.tree_leaves(x[part]) for x in (after4, after5, after6))
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True)), part
        assert not all(np.array_equal(x, y) for x, y in zip(b, c, strict=True)), part
        assert all(np.isfinite(x).all() for x in c if np.issubdtype(x.dtype, np.floating))


def test_init_from_starts_from_another_runs_weights(shared_data, tmp_path):
    from electra_jax import pretrained

    # Stopped early rather than fewer train.num_steps (a program of its own): a's program is
    # test_a_run_with_unrolled_layers_resumes_in_its_own_layout's, b's the micro run's.
    first = config_with(shared_data)
    first.model.scan_layers = False  # a's layers unrolled, b's stacked: the weights convert
    runner.train(first, str(tmp_path / "a"), stop_after=3)
    cfg = config_with(shared_data)
    cfg.data.tokenizer = ""  # the tokenizer comes with the weights
    cfg.train.init_from = str(tmp_path / "a")
    runner.train(cfg, str(tmp_path / "b"), stop_after=1)
    a = pretrained.load_pretrained(str(tmp_path / "a"))
    b = pretrained.load_pretrained(str(tmp_path / "b"))
    assert not a.spec.scan_layers and b.spec.scan_layers
    assert "layers" in b.params["discriminator"] and "layer_0" in a.params["discriminator"]
    # The first update's learning rate is 0 (warm-up), so b's step 1 holds a's weights exactly.
    b_unrolled = layer_stack.unstack(b.params)
    for x, y in zip(*(jax.tree_util.tree_leaves(p) for p in (a.params, b_unrolled)), strict=True):
        np.testing.assert_array_equal(x, y)
    assert b.tokenizer.fingerprint == a.tokenizer.fingerprint

    cfg.model.hidden_size = 32
    cfg.data.cache_dir = ""  # WORKDIR/data: the corpus would be tokenized and packed there
    with pytest.raises(runner.validate.ConfigError, match="other shapes"):
        runner.train(cfg, str(tmp_path / "c"))
    assert not (tmp_path / "c" / "data").exists()  # refused before the data was prepared


def test_init_from_whose_tokenizer_does_not_fit_its_embeddings_is_named(micro):
    """A tokenizer of 6 pieces beside embeddings of 300 rows: named as such, before any work,
    not as a model.* of other shapes."""
    from electra_jax.data.wordpiece import WordPieceTokenizer
    from electra_jax.model import networks, weights

    tok = WordPieceTokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the"])
    spec = networks.spec_from_config(micro.model, micro.generator, 300)
    loaded = weights.Pretrained(spec, {}, tok, "hf:x")
    with pytest.raises(runner.validate.ConfigError) as e:
        runner._check_init_from(loaded, micro)
    assert str(e.value).startswith(
        "train.init_from=hf:x: its tokenizer has 6 pieces but its embeddings 300 rows"
    )


def test_init_from_a_wordpiece_transformers_pair_continues_pretraining(tmp_path):
    """Google's released checkpoints: BERT vocab ([MASK] 103), full-width generator (Small++).
    [PAD] is put at id 7 here: a vocab.txt may hold it anywhere, and the run pads and masks with
    the tokenizer's, not with id 0."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    letters = "abcdefghijklmnopqrstuvwxyz"
    unused = [f"[unused{i}]" for i in range(99)]
    vocab = [*unused[:7], "[PAD]", *unused[7:], "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    vocab += [*".,:;!?'\"-()0123456789", *letters, *[f"##{c}" for c in letters]]
    vocab += ["the", "of", "and", "to", "a", "is", "in", "for", "this", "that", "be", "return"]
    torch.manual_seed(0)
    hf_config = transformers.ElectraConfig(
        vocab_size=len(vocab),
        embedding_size=32,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=1,
        intermediate_size=256,
        max_position_embeddings=512,
    )
    pair = tmp_path / "electra-small"
    models = {
        "discriminator": transformers.ElectraForPreTraining(hf_config),
        "generator": transformers.ElectraForMaskedLM(hf_config),
    }
    for name, m in models.items():
        m.save_pretrained(pair / name)
        (pair / name / "vocab.txt").write_text("".join(f"{v}\n" for v in vocab))

    cfg = micro_config()
    cfg.model.num_heads, cfg.model.intermediate_size = 1, 256
    cfg.generator.hidden_fraction = 1.0  # as wide as the discriminator, like Small++
    cfg.data.vocab_size = len(vocab)
    cfg.data.cache_dir = str(tmp_path / "cache")
    cfg.data.heldout_examples = 0  # 317 rows: too few to hold the micro config's 256 out
    corpus = tmp_path / "corpus.txt"  # small, so that preparing it takes no time
    words = [
        "the",
        "chef",
        "cooked",
        "a",
        "meal",
        "for",
        "this",
        "family",
        "and",
        "that",
        "is",
        "the",
        "end",
        "of",
        "it",
    ]
    lines = [" ".join(words[(i * 7) % 9 :] + [str(i)]) + "." for i in range(400)]
    corpus.write_text("\n".join(line if i % 8 else "" for i, line in enumerate(lines)))
    cfg.data.source = f"text:{corpus}"
    cfg.train.init_from = f"hf:{pair}"
    # Stopped at step 2 and resumed to 3: one program (train.num_steps is part of it).
    cfg.train.num_steps, cfg.checkpoint.every_steps = 3, 1
    workdir = tmp_path / "run"
    row = runner.train(cfg, str(workdir), stop_after=2)
    assert (workdir / "tokenizer" / "vocab.txt").exists()
    assert not (workdir / "tokenizer" / "spm.model").exists()
    assert math.isfinite(row["loss"]) and row["masked_fraction"] > 0

    # The generator sees [MASK] = 103, the tokenizer's, not our SentencePiece models' 4.
    from electra_jax.data import pipeline, shards, tokenizer

    tok = tokenizer.load_saved(str(workdir / "tokenizer"))
    batch = next(pipeline.make_iterator(shards.prepare(cfg.data, tok, cfg.data.cache_dir, 0), 8, 0))
    special = optimizer_step.special_tokens_of(tok)
    masked = core.mask_tokens(
        jax.random.PRNGKey(0),
        batch["input_ids"],
        batch["input_mask"],
        mask_prob=0.15,
        num_slots=4,
        mask_id=special.mask,
        special_ids=tuple(special),
    )
    assert special == (7, 101, 102, 103) and int((masked.input_ids == 103).sum()) > 0
    assert batch["input_ids"][0, 0] == 101  # rows start with [CLS] = 101
    # Padded with [PAD] = 7, and only those positions are out of the input mask.
    assert (batch["input_ids"] == 7).any()
    np.testing.assert_array_equal(batch["input_mask"], batch["input_ids"] != 7)

    # Resuming reads the workdir's vocab.txt; init_from is not read again.
    cfg.train.init_from = str(tmp_path / "gone")
    assert runner.train(cfg, str(workdir))["loss"] > 0


@pytest.mark.slow
def test_steps_per_call_runs_the_same_steps_and_resumes_exactly(shared_data, tmp_path):
    def run(workdir, per_call, every, stop_after=None):
        cfg = config_with(shared_data)
        cfg.train.steps_per_call = per_call
        cfg.log.every_steps = cfg.checkpoint.every_steps = every
        runner.train(cfg, str(tmp_path / workdir), stop_after=stop_after)
        return {r["step"]: r for r in metrics.read_rows(str(tmp_path / workdir / "metrics.jsonl"))}

    one = run("one", 1, 1)
    two = run("two", 2, 2)  # three whole calls
    # A whole call of steps 1-2, then single steps: calls end at step 3 (log, checkpoint) and
    # at 5 (stop_after: a row too, where the checkpoint is), and the resumed run starts off the
    # grid of calls.
    run("cut", 2, 3, stop_after=5)
    cut = run("cut", 2, 3)
    assert sorted(two) == [2, 4, 6] and sorted(cut) == [3, 5, 6]
    for rows in (two, cut):
        for step, row in rows.items():
            for k in ("loss", "gen_loss", "disc_loss", "grad_norm", "gen_accuracy"):
                assert row[k] == one[step][k], (step, k)


@pytest.mark.slow
def test_steps_per_call_finds_a_nan_inside_a_call(shared_data, tmp_path):
    cfg = config_with(shared_data)
    cfg.train.steps_per_call = cfg.log.every_steps = 2
    cfg.checkpoint.every_steps = 4
    cfg.train.debug_nan_at_step = 2  # the update of step 3, the first of the call [3, 4]
    with pytest.raises(runner.NonFiniteError, match=r"at step 3 \(found checking steps 3-4"):
        runner.train(cfg, str(tmp_path / "stop"))
    cfg.train.nan_policy = "skip"
    runner.train(cfg, str(tmp_path / "skip"))
    rows = metrics.read_rows(str(tmp_path / "skip" / "metrics.jsonl"))
    assert [r["skipped_updates"] for r in rows] == [0, 1, 0]


def test_steps_per_call_must_be_positive(micro, tmp_path):
    micro.train.steps_per_call = 0
    with pytest.raises(runner.validate.ConfigError, match=r"train.steps_per_call=0 must be >= 1"):
        runner.train(micro, str(tmp_path / "w"))


def test_a_workdir_held_by_another_run_is_refused_before_any_work(shared_data, tmp_path):
    from electra_jax.run import workdir as workdir_lib

    path = tmp_path / "w"
    with workdir_lib.claimed(str(path), workdir_lib.PRETRAIN, command="electra_jax.train"):
        with pytest.raises(runner.validate.ConfigError, match="is in use by electra_jax.train"):
            runner.train(config_with(shared_data), str(path))
        assert sorted(os.listdir(path)) == [".electra_jax", ".lock"]  # nothing else written


@pytest.mark.slow
def test_resume_checks_settings_and_shapes_and_records_allowed_changes(shared_data, tmp_path):
    cfg = config_with(shared_data)
    workdir = tmp_path / "w"
    runner.train(cfg, str(workdir), stop_after=3)
    stored = (workdir / "config.json").read_text()

    # Another learning rate is refused by name, before any work; allowed, it is recorded.
    other = config_with(shared_data)
    other.train.learning_rate = 5e-4
    with pytest.raises(runner.validate.ConfigError, match=r"train.learning_rate=0.001 there vs"):
        runner.train(other, str(workdir))
    assert (workdir / "config.json").read_text() == stored

    # Without config.json, the run is not resumed with the command line's settings unless
    # that is allowed; allowed, another model is found in the checkpoint's shapes: one error,
    # nothing moved aside (the data loss: both checkpoints renamed .corrupt).
    os.remove(workdir / "config.json")
    with pytest.raises(runner.validate.ConfigError, match="config.json is missing"):
        runner.train(cfg, str(workdir), stop_after=4)
    deeper = config_with(shared_data)
    deeper.model.num_layers = 3
    with pytest.raises(runner.validate.ConfigError) as e:
        runner.train(deeper, str(workdir), allow_changes=("config.json",))
    assert "holds another state than this config describes, in the model" in str(e.value)
    assert "nothing was moved aside" in str(e.value)
    assert sorted(os.listdir(workdir / "checkpoints")) == ["3"]

    # The right model, allowed, resumes and writes config.json back (and says so in
    # config_changes.jsonl); then the allowed change is recorded.
    runner.train(cfg, str(workdir), stop_after=4, allow_changes=("config.json",))
    assert (workdir / "config.json").read_text() == stored
    runner.train(other, str(workdir), stop_after=5, allow_changes=("train.learning_rate",))
    assert json.loads((workdir / "config.json").read_text())["train"]["learning_rate"] == 5e-4
    text = (workdir / "config_changes.jsonl").read_text()
    rows = [json.loads(line) for line in text.splitlines()]
    assert rows == [
        {"changes": {}, "config.json": "missing, written again", "step": 3},
        {"changes": {"train.learning_rate": {"from": 1e-3, "to": 5e-4}}, "step": 4},
    ]
    steps = [r["step"] for r in metrics.read_rows(str(workdir / "metrics.jsonl"))]
    assert steps == [1, 2, 3, 4, 5]


@pytest.mark.slow
def test_two_stage_resumes_across_the_switch_exactly(shared_data, tmp_path):
    from tests.pretraining.test_optimizer_step import two_stage_config

    cfg = two_stage_config()
    cfg.data.tokenizer, cfg.data.cache_dir = shared_data
    cfg.objective.two_stage_steps = 4
    straight = tmp_path / "straight"
    runner.train(cfg, str(straight))
    rows = metrics.read_rows(str(straight / "metrics.jsonl"))
    assert [r["stage"] for r in rows] == [1, 1, 1, 1, 2, 2]  # the switch step is in the rows
    resumed = tmp_path / "resumed"
    runner.train(cfg, str(resumed), stop_after=3)  # before the switch; resumed across it
    runner.train(cfg, str(resumed))
    again = metrics.read_rows(str(resumed / "metrics.jsonl"))
    assert [(r["step"], r["loss"], r["stage"]) for r in again] == [
        (r["step"], r["loss"], r["stage"]) for r in rows
    ]


def test_a_run_with_unrolled_layers_resumes_in_its_own_layout(shared_data, tmp_path, capsys):
    """A run started before model.scan_layers existed (its config.json lacks the key, its
    checkpoints hold layer_0 ...) resumes under today's default without conversion or refusal,
    exactly as an unrolled run that was never interrupted."""
    cfg = config_with(shared_data)
    cfg.model.scan_layers = False
    straight = runner.train(cfg, str(tmp_path / "straight"))
    old = tmp_path / "old"
    runner.train(cfg, str(old), stop_after=3)
    stored = json.loads((old / "config.json").read_text())
    del stored["model"]["scan_layers"]
    (old / "config.json").write_text(json.dumps(stored))
    capsys.readouterr()
    resumed = runner.train(config_with(shared_data), str(old))  # scan_layers=True
    assert "checkpoints hold their layers unrolled; resuming with model.scan_layers=False" in (
        capsys.readouterr().err
    )
    for k in ("loss", "gen_loss", "disc_loss", "grad_norm"):
        assert resumed[k] == straight[k], k


@pytest.mark.slow
def test_the_recipes_schedules_run_in_whole_calls_and_resume_exactly(shared_data, tmp_path):
    """The temperature schedule, the fading discriminator MLM term and the unigram floor are
    functions of the step inside the compiled call: two steps per call and a resume give the
    single steps' numbers; a workdir of such a run loads with its MLM head."""
    from electra_jax import pretrained

    def run(workdir, per_call, stop_after=None):
        cfg = config_with(shared_data)
        cfg.objective.temperature_start, cfg.objective.temperature_steps = 3.0, 4
        cfg.objective.disc_mlm_weight, cfg.objective.disc_mlm_steps = 1.0, 5
        cfg.objective.unigram_share, cfg.objective.unigram_share_steps = 1.0, 4
        cfg.train.steps_per_call = per_call
        runner.train(cfg, str(tmp_path / workdir), stop_after=stop_after)
        return metrics.read_rows(str(tmp_path / workdir / "metrics.jsonl"))

    one = run("one", 1)
    run("two", 2, stop_after=3)
    two = run("two", 2)
    assert [r["temperature"] for r in one] == [3.0, 2.5, 2.0, 1.5, 1.0, 1.0]
    assert [r["unigram_share"] for r in one] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
    keys = ("loss", "disc_mlm_loss", "disc_mlm_weight", "temperature", "unigram_share")
    for a, b in zip(one, two, strict=True):
        for k in (*keys, "grad_norm"):
            assert a[k] == b[k], (a["step"], k)
    loaded = pretrained.load_pretrained(str(tmp_path / "one"))
    assert loaded.spec.mlm_head and "mlm_predictions_dense" in loaded.params


@pytest.mark.slow
def test_a_folder_where_the_run_writes_a_file_is_refused_before_the_work(shared_data, tmp_path):
    """metrics.jsonl a folder (or tensorboard a file): one line at once, through the command,
    not an IsADirectoryError once the step has compiled; its advice is not "free space"."""
    from tests.conftest import error_line, micro_config_file, run_command

    cfg = config_with(shared_data)
    workdir = tmp_path / "w"
    runner.train(cfg, str(workdir), stop_after=3)
    config = micro_config_file(tmp_path / "config.py", shared_data)
    (workdir / "metrics.jsonl").unlink()
    (workdir / "metrics.jsonl").mkdir()
    out = run_command("electra_jax.train", f"--config={config}", f"--workdir={workdir}")
    assert error_line(out) == (
        f"error: {workdir / 'metrics.jsonl'} is a folder, where the run writes a file of that "
        "name; move it away (or choose another --workdir)"
    )
    assert "compiled" not in out.stderr and sorted(os.listdir(workdir / "checkpoints")) == ["3"]
