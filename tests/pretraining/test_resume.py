"""resume: what a run continues from (plan), and the rules it applies to a stored config."""

import json
import os
import pathlib

import pytest

from electra_jax.config import pretrain_keys, schema
from electra_jax.config.schema import flatten
from electra_jax.errors import CheckpointError, ConfigError, DataError
from electra_jax.pretraining import resume, runner
from electra_jax.run import rerun, workdir
from electra_jax.store import checkpointing
from tests import command_server
from tests.conftest import micro_config
from tests.pretraining.test_runner import config_with, prepare_shared_data


@pytest.fixture(scope="module")
def shared_data(tmp_path_factory):
    return prepare_shared_data(tmp_path_factory)


def _run_workdir(path, stored: dict | None = None, steps=("3",)) -> str:
    """A pre-training workdir as a run leaves it, as far as `plan` reads it: the marker,
    config.json (`stored`, else the micro config's) and finished checkpoint steps."""
    workdir.claim(str(path), workdir.PRETRAIN).release()
    with open(path / "config.json", "w") as f:
        json.dump(micro_config().to_dict() if stored is None else stored, f)
    for step in steps:
        os.makedirs(path / "checkpoints" / step)
    return str(path)


def _stored(config):
    return json.loads(json.dumps(config.to_dict()))  # what config.json holds


def _held(stored: dict, config, path: str, allowed=(), model_only=False) -> dict:
    """The plan's hold of `config` to a stored config.json (`stored`, at `path`): the allowed
    changes, or ConfigError in the plan's words (of the model's settings only: `model_only`)."""
    rules = resume.PRETRAINING
    old = rerun.stored_settings(stored, rules.keys)
    new = flatten(config.to_dict())
    changes, refused = rerun.compare(old, new, rules, allowed)
    if model_only:
        refused = [k for k in refused if schema.resume_rule(k, rules.keys) == schema.MODEL]
    if refused:
        run = rerun.Resume(os.path.dirname(path), config, rules)
        raise ConfigError(rules.refusal(run, old, new, refused))
    return changes


def _same_model(stored: dict, config, path: str) -> None:
    _held(stored, config, path, model_only=True)


def _same_run(stored: dict, config, path: str, allowed=()) -> dict:
    return _held(stored, config, path, allowed)


def test_same_model_passes_and_ignores_non_model_keys():
    stored = _stored(micro_config())
    config = micro_config()
    config.train.batch_size, config.train.num_steps = 16, 1000  # a longer run, other batch: fine
    config.model.dtype = "bfloat16"  # compute type only; the parameters stay float32
    _same_model(stored, config, "w/config.json")


def test_different_model_names_the_keys_and_the_fix():
    stored = _stored(micro_config())
    config = micro_config()
    config.model.hidden_size = 128
    config.data.vocab_size = 400
    with pytest.raises(ConfigError) as e:
        _same_model(stored, config, "w/config.json")
    message = str(e.value)
    assert message.startswith("w/config.json describes a different model")
    assert "data.vocab_size=300 there vs 400 now" in message
    assert "model.hidden_size=64 there vs 128 now" in message
    assert "use a new --workdir" in message and "\n" not in message


def test_missing_key_in_stored_config_counts_as_different():
    stored = _stored(micro_config())
    del stored["generator"]["layers_fraction"]
    with pytest.raises(ConfigError, match="generator.layers_fraction=None there"):
        _same_model(stored, micro_config(), "config.json")


def test_a_resume_keeps_the_runs_settings_unless_a_change_is_allowed():
    stored = _stored(micro_config())
    config = micro_config()
    # Free on resume: how long, how laid out, how often written.
    config.train.num_steps, config.train.steps_per_call = 1000, 1
    config.checkpoint.every_steps, config.log.every_steps, config.mesh.fsdp = 50, 7, -1
    config.log.profile_steps, config.compile.cache_dir = 20, "off"
    assert _same_run(stored, config, "w/config.json") == {}
    # The data, the schedule and the optimizer are the run: refused, naming the keys and the way.
    config.data.source = "text:other/*.txt"
    config.train.adam_bias_correction = False
    with pytest.raises(ConfigError) as e:
        _same_run(stored, config, "w/config.json")
    message = str(e.value)
    assert "data.source='builtin' there vs 'text:other/*.txt' now" in message
    assert "train.adam_bias_correction=True there vs False now" in message
    assert "--allow_change=data.source,train.adam_bias_correction" in message
    assert "\n" not in message
    # Allowed: returned for the caller to record.
    changes = _same_run(
        stored, config, "w/config.json", ("data.source", "train.adam_bias_correction")
    )
    assert changes == {
        "data.source": ("builtin", "text:other/*.txt"),
        "train.adam_bias_correction": (True, False),
    }
    # A key the stored config lacks (added to the framework later) is not compared.
    del stored["train"]["steps_per_call"], stored["compile"], stored["log"]["profile_steps"]
    _same_run(stored, micro_config(), "w/config.json")


def test_stored_layer_layout_defaults_to_unrolled():
    stored = {"model": {"hidden_size": 64}, "generator": {}}
    assert resume.stored_scan_layers(flatten(stored)) is False  # written before the option
    stored["model"]["scan_layers"] = True
    assert resume.stored_scan_layers(flatten(stored)) is True
    filled = schema.upgrade(stored, pretrain_keys.KEYS)
    assert filled["data"]["heldout_examples"] == 0 and filled["model"]["scan_layers"] is True
    assert "data" not in stored  # a new dict


def test_a_new_workdir_starts_over_with_the_config_as_given(tmp_path):
    config = micro_config()
    run = resume.plan(config, str(tmp_path / "new"))
    try:
        assert run.config is config and run.changes == {} and resume.start_from(run) is None
        assert run.workdir == str(tmp_path / "new")
        # The claim is the run's: a second plan on the workdir is refused, in one line.
        with pytest.raises(ConfigError, match="is in use by"):
            resume.plan(micro_config(), str(tmp_path / "new"))
        run.record(None)  # a new run writes its config.json
        stored = json.loads((tmp_path / "new" / "config.json").read_text())
        assert stored == json.loads(json.dumps(config.to_dict()))
    finally:
        run.release()
    resume.plan(micro_config(), str(tmp_path / "new")).release()  # free again


def test_a_plan_without_the_claim_writes_nothing_and_is_claimed_as_the_workdir_then_is(
    tmp_path,
):
    """The command line's plan (claim=False) writes nothing; `take` claims the workdir and asks
    again what another process may have changed before the lock: its checkpoints and config.json."""
    path = _run_workdir(tmp_path / "w", steps=("3",))
    before = sorted(os.listdir(path))
    planned = resume.plan(micro_config(), path, claim=False)
    assert planned.claim is None and planned.resumes and sorted(os.listdir(path)) == before
    run = rerun.take(planned)
    try:
        assert run.claim is not None and run.config is planned.config
        with pytest.raises(ConfigError, match="is in use by"):
            resume.plan(micro_config(), path)
    finally:
        run.release()
    # A checkpoint beyond train.num_steps saved since the plan: refused at the claim.
    config = micro_config()
    config.train.num_steps = 4
    planned = resume.plan(config, path, claim=False)
    os.makedirs(os.path.join(path, "checkpoints", "6"))
    with pytest.raises(ConfigError, match="train.num_steps=4 is below step 6"):
        rerun.take(planned)
    # Another model's run started in a new workdir since the plan: held to it at the claim.
    new = tmp_path / "new"
    planned = resume.plan(micro_config(), str(new), claim=False)
    other = micro_config()
    other.model.hidden_size *= 2
    _run_workdir(new, _stored(other))
    with pytest.raises(ConfigError, match="describes a different model"):
        rerun.take(planned)
    resume.plan(other, str(new)).release()  # the refusals released the workdir


def test_a_resume_keeps_the_stored_run_and_records_the_allowed_changes(tmp_path):
    path = _run_workdir(tmp_path / "w")
    config = micro_config()
    config.train.num_steps = 60  # free on resume: not a change to record
    run = resume.plan(config, path)
    assert run.changes == {}
    run.release()

    config.data.source = "text:other/*.txt"
    with pytest.raises(ConfigError, match="--allow_change=data.source"):
        resume.plan(config, path)
    run = resume.plan(config, path, ("data.source",))  # the refusal released the claim
    try:
        assert run.changes == {"data.source": ("builtin", "text:other/*.txt")}
        run.record(3)
        rows = (tmp_path / "w" / "config_changes.jsonl").read_text().splitlines()
        assert json.loads(rows[-1]) == {
            "step": 3,
            "changes": {"data.source": {"from": "builtin", "to": "text:other/*.txt"}},
        }
        stored = json.loads((tmp_path / "w" / "config.json").read_text())
        assert stored["data"]["source"] == "text:other/*.txt"  # goes on with the new setting
    finally:
        run.release()

    with pytest.raises(ConfigError, match="--allow_change names data.sauce, which is not"):
        resume.plan(config, path, ("data.sauce",))
    config.model.hidden_size = 128
    with pytest.raises(ConfigError, match="describes a different model"):
        resume.plan(config, path, ("data.source",))


def test_a_license_chosen_after_the_run_is_recorded_where_the_export_reads_it(tmp_path):
    """export.license changes no number, but the export reads it from config.json: a resume
    changes it only when asked, and records it there."""
    path = _run_workdir(tmp_path / "w")
    config = micro_config()
    config.export.license = "apache-2.0"
    with pytest.raises(ConfigError, match="--allow_change=export.license"):
        resume.plan(config, path)
    run = resume.plan(config, path, ("export.license",))
    try:
        run.record(3)
        stored = json.loads((tmp_path / "w" / "config.json").read_text())
        assert stored["export"]["license"] == "apache-2.0"
    finally:
        run.release()


def test_each_start_records_its_command_line_at_its_step(tmp_path):
    # For the export's model card: the command that started the run and those that resumed it.
    new = str(tmp_path / "new")
    for command, resumed_at in (("python -m electra_jax.train --workdir=w", None), (None, 4)):
        run = resume.plan(micro_config(), new, command=command)
        try:
            run.record(resumed_at)
        finally:
            run.release()
    path = _run_workdir(tmp_path / "w")
    run = resume.plan(micro_config(), path, command="python -m electra_jax.train --again")
    try:
        run.record(7)
    finally:
        run.release()
    rows = [json.loads(x) for x in (tmp_path / "new" / workdir.COMMANDS_FILE).open()]
    assert rows == [{"step": 0, "command": "python -m electra_jax.train --workdir=w"}]  # API: none
    rows = [json.loads(x) for x in (tmp_path / "w" / workdir.COMMANDS_FILE).open()]
    assert rows == [{"step": 7, "command": "python -m electra_jax.train --again"}]


def test_a_run_from_before_a_setting_existed_keeps_what_it_meant(tmp_path):
    """Its checkpoints hold the layers unrolled and it trained on every row: the plan's config
    says so, whatever the config asks; the config itself is left as it was."""
    stored = micro_config().to_dict()
    del stored["model"]["scan_layers"], stored["data"]["heldout_examples"]
    path = _run_workdir(tmp_path / "old", stored)
    config = micro_config()
    config.model.scan_layers, config.data.heldout_examples = True, 32
    run = resume.plan(config, path)
    run.release()
    assert run.config.model.scan_layers is False and run.config.data.heldout_examples == 0
    assert config.model.scan_layers is True and config.data.heldout_examples == 32
    assert run.changes == {}  # a layout, not a change of the run


def test_an_unreadable_config_or_only_damaged_checkpoints_are_refused(tmp_path):
    path = _run_workdir(tmp_path / "w")
    (tmp_path / "w" / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json cannot be read"):
        resume.plan(micro_config(), path)
    (tmp_path / "w" / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="is not the config of an electra_jax run"):
        resume.plan(micro_config(), path)
    # A missing config.json: refused, never resumed with the command line's settings unsaid;
    # allowed, the checkpoints' shapes are checked at the restore instead.
    os.remove(tmp_path / "w" / "config.json")
    with pytest.raises(ConfigError, match=r"config.json is missing, .*--allow_change=config.json"):
        resume.plan(micro_config(), path)
    run = resume.plan(micro_config(), path, ("config.json",))
    run.release()
    assert run.changes == {}

    damaged = _run_workdir(tmp_path / "d", steps=())
    os.makedirs(tmp_path / "d" / "checkpoints" / f"3{checkpointing.CORRUPT_SUFFIX}")
    with pytest.raises(CheckpointError, match="only checkpoints set aside as damaged"):
        resume.plan(micro_config(), damaged)


def _switch_config(name: str, key: str, value: int):
    """The micro config under objective `name` ('two_stage' or 'adversarial') with its switch
    `key` at `value`, 12 steps long."""
    from tests.pretraining.test_optimizer_step import two_stage_config

    config = two_stage_config() if name == "two_stage" else micro_config()
    config.objective.name = name
    config.objective[key.split(".")[1]] = value
    config.train.num_steps = 12
    return config


@pytest.mark.parametrize(
    "name,key",
    [("two_stage", "objective.two_stage_steps"), ("adversarial", "objective.mle_warmup_steps")],
)
def test_a_switch_moved_across_the_resumed_step_is_refused(tmp_path, name, key):
    """Resumed at step 6: a switch behind the run may move behind it, one ahead ahead of it;
    across, the run would go back into a phase it left (two_stage: copy the generator over the
    trained discriminator again), or past a switch it never made."""
    for old, new, refused in [
        (4, 9, "passed its switch at step 4; at 9 it would go back into the first phase"),
        (4, 6, "passed its switch at step 4; at 6"),  # the update of step 6 would switch again
        (8, 3, "has not reached its switch at step 8; at 3 the switch would lie behind the run"),
        (4, 2, None),  # behind the run either way: nothing changes
        (8, 10, None),
        (8, 6, None),  # the next update switches
    ]:
        path = _run_workdir(
            tmp_path / f"w{old}-{new}", _stored(_switch_config(name, key, old)), ["6"]
        )
        config = _switch_config(name, key, new)
        if refused is None:
            run = resume.plan(config, path, (key,))
            run.release()
            assert run.changes == {key: (old, new)}
            continue
        with pytest.raises(ConfigError) as e:
            resume.plan(config, path, (key,))
        message = str(e.value)
        assert message.startswith(f"--allow_change={key}: {key}={new} would rewrite the run's")
        assert refused in message and "\n" not in message
        way = "keep it below 6" if old < 6 else "set it to 6 to switch at the next step"
        assert way in message
        # The claim went with the refusal; nothing was written.
        assert not os.path.exists(os.path.join(path, workdir.CHANGES_FILE))
    # Another objective does not read the key: its change is any allowed change.
    path = _run_workdir(tmp_path / "electra", _stored(micro_config()), ["6"])
    config = micro_config()
    config.objective[key.split(".")[1]] = 9
    resume.plan(config, path, (key,)).release()


def test_num_steps_below_the_resumed_step_is_refused_before_any_work(tmp_path):
    path = _run_workdir(tmp_path / "w", steps=("3", "6"))
    config = micro_config()
    config.train.num_steps = 4
    with pytest.raises(ConfigError) as e:
        resume.plan(config, path)
    assert str(e.value) == (
        f"train.num_steps=4 is below step 6, where the run in {path} is (checkpoint 6): "
        "nothing would be trained, and a run is not shortened after the fact; set "
        "train.num_steps above 6 to go on, or use a new --workdir for a shorter run"
    )
    config.train.num_steps = 6  # a finished run run again: the loop says nothing was trained
    resume.plan(config, path).release()


def test_checkpoints_that_are_not_the_runs_are_refused_before_any_work(tmp_path):
    """An export put into checkpoints/, a checkpoint renamed by hand: refused by the plan,
    before the data is prepared and the step compiled; a user's other folder is no step."""
    path = _run_workdir(tmp_path / "w", steps=("3",))
    checkpoints = tmp_path / "w" / "checkpoints"
    (checkpoints / "backup").mkdir()
    (checkpoints / "backup" / "notes.txt").write_text("a user's file")
    resume.plan(micro_config(), path).release()
    (checkpoints / "99").mkdir()
    (checkpoints / "99" / "export.json").write_text("{}")
    with pytest.raises(checkpointing.ForeignFolderError, match="99 holds export.json, not a"):
        resume.plan(micro_config(), path)
    os.rename(checkpoints / "99", tmp_path / "export")
    (checkpoints / "5" / "position").mkdir(parents=True)  # checkpoint 3, renamed
    position = {"data": {"next_index": 3}, "layout": {"processes": 1, "devices": 1}}
    (checkpoints / "5" / "position" / "position.json").write_text(json.dumps(position))
    with pytest.raises(checkpointing.ForeignFolderError, match="state at step 3 .*not step 5"):
        resume.plan(micro_config(), path)
    assert sorted(os.listdir(checkpoints)) == ["3", "5", "backup"]


def test_init_from_is_loaded_for_a_new_run_only(shared_data, tmp_path):
    first = config_with(shared_data)
    first.train.num_steps, first.checkpoint.every_steps = 1, 1
    runner.train(first, str(tmp_path / "a"))
    cfg = micro_config()
    cfg.train.init_from = str(tmp_path / "a")
    run = resume.plan(cfg, str(tmp_path / "b"))
    run.release()
    assert resume.start_from(run).source == f"{tmp_path / 'a'} (checkpoint 1)"
    assert (tmp_path / "b" / "tokenizer" / "spm.model").exists()  # its tokenizer comes along
    # A workdir with checkpoints continues from its own state.
    run = resume.plan(cfg, _run_workdir(tmp_path / "c"))
    run.release()
    assert resume.start_from(run) is None
    cfg.data.tokenizer = shared_data[0]
    with pytest.raises(ConfigError, match="brings its own tokenizer; leave data.tokenizer empty"):
        resume.start_from(resume.plan(cfg, str(tmp_path / "d"), claim=False))


def _files(folder) -> dict:
    return {str(p): p.read_bytes() for p in sorted(pathlib.Path(folder).rglob("*")) if p.is_file()}


def test_init_from_refuses_another_tokenizer_in_the_workdir_and_keeps_the_same(
    shared_data, tmp_path
):
    """Weights and their tokenizer come from one source: a tokenizer `prepare` placed (another
    SentencePiece model, or a WordPiece vocab.txt) is neither replaced by init_from's nor run
    with its weights; the very same tokenizer is kept as it is."""
    import shutil

    from electra_jax.data import tokenizer as tokenizer_lib

    tokenizer_dir = pathlib.Path(shared_data[0]).parent
    source = str(tokenizer_dir.parent)  # the shared run: trained, with its checkpoint
    cfg = micro_config()
    cfg.train.init_from = source
    spm_other = tmp_path / "spm" / "tokenizer"
    words = ["river", "house", "tree", "city", "king", "ship", "road", "garden", "winter"]
    sentences = [" ".join(words[(i * k) % 9] for k in range(1, 8)) for i in range(200)]
    tokenizer_lib.train_tokenizer(sentences, str(spm_other), 30, 1.0, 0, 1000)
    (tmp_path / "vocab" / "tokenizer").mkdir(parents=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    (tmp_path / "vocab" / "tokenizer" / "vocab.txt").write_text("".join(f"{v}\n" for v in vocab))
    for name, kind in (("spm", "SentencePiece, 30 pieces"), ("vocab", "WordPiece vocab.txt")):
        folder = tmp_path / name / "tokenizer"
        before = _files(folder)
        with pytest.raises(ConfigError) as info:
            resume.start_from(resume.plan(cfg, str(tmp_path / name), claim=False))
        line = str(info.value)
        assert line.startswith(f"{folder} holds a tokenizer ({kind}") and "\n" not in line
        assert f"than the one train.init_from={source} was trained with (SentencePiece" in line
        assert _files(folder) == before  # neither replaced nor joined by init_from's files
    same = tmp_path / "same"
    shutil.copytree(tokenizer_dir, same / "tokenizer")
    before = _files(same / "tokenizer")
    run = resume.plan(cfg, str(same))
    run.release()
    assert (
        resume.start_from(run).tokenizer.fingerprint
        == tokenizer_lib.load_saved(str(same / "tokenizer")).fingerprint
    )
    assert _files(same / "tokenizer") == before


CORPUS_CONFIG = """import sys

sys.path.insert(0, {root!r})
from tests.micro import micro_config  # noqa: E402


def get_config():
    config = micro_config()
    config.data.source = {source!r}
    config.data.tokenizer, config.data.cache_dir = {tokenizer!r}, {cache!r}
    config.data.heldout_examples = 0  # a small corpus
    return config
"""


def _corpus_file(path, seed):
    import random

    rng = random.Random(seed)
    words = ["the", "river", "house", "tree", "city", "king", "ship", "road", "garden"]
    lines = [" ".join(rng.choice(words) for _ in range(10)) + "." for _ in range(300)]
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def text_run(shared_data, tmp_path):
    """(config file, workdir): a micro run on a text: folder of two files, stopped at step 3."""
    import runpy

    from tests.conftest import ROOT

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(2):
        _corpus_file(corpus / f"part{i}.txt", i)
    config_file = tmp_path / "text.py"
    source = f"text:{corpus}/*.txt"
    tokenizer, _ = shared_data
    config_file.write_text(
        CORPUS_CONFIG.format(
            root=str(ROOT), source=source, tokenizer=tokenizer, cache=str(tmp_path / "cache")
        )
    )
    run = tmp_path / "w"
    runner.train(runpy.run_path(str(config_file))["get_config"](), str(run), stop_after=3)
    return config_file, run


def _get(config_file):
    import runpy

    return runpy.run_path(str(config_file))["get_config"]()


def test_a_resume_refuses_a_corpus_changed_under_the_same_source(text_run):
    config_file, run = text_run
    record = json.loads((run / workdir.DATA_RECORD).read_text())
    assert [os.path.basename(p) for p, _ in record["files"]] == ["part0.txt", "part1.txt"]
    corpus = os.path.dirname(record["files"][0][0])
    _corpus_file(tmp := pathlib.Path(corpus) / "part2.txt", 2)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    with pytest.raises(ConfigError) as e:
        runner.train(_get(config_file), str(run))
    message = str(e.value)
    assert "the corpus under data.source 'text:" in message and "files added: part2.txt" in message
    assert "--allow_change=data.source" in message and "\n" not in message
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before  # nothing prepared, nothing written
    # A file edited in place (another size) and one removed are named too.
    tmp.unlink()
    _corpus_file(pathlib.Path(corpus) / "part1.txt", 7)
    os.truncate(os.path.join(corpus, "part1.txt"), 100)
    with pytest.raises(ConfigError, match=r"resized: part1.txt"):
        runner.train(_get(config_file), str(run))
    os.remove(os.path.join(corpus, "part1.txt"))
    with pytest.raises(ConfigError, match=r"removed: part1.txt"):
        runner.train(_get(config_file), str(run))

    # Allowed, the run goes on with the corpus as it is and says so in config_changes.jsonl.
    runner.train(_get(config_file), str(run), stop_after=4, allow_changes=("data.source",))
    rows = [json.loads(x) for x in (run / "config_changes.jsonl").read_text().splitlines()]
    assert rows[-1]["step"] == 3 and "source_fingerprint" in rows[-1]["data"]
    record = json.loads((run / workdir.DATA_RECORD).read_text())
    assert [os.path.basename(p) for p, _ in record["files"]] == ["part0.txt"]
    runner.train(_get(config_file), str(run), stop_after=5)  # the new record stands


def test_a_run_started_before_the_data_record_resumes_as_it_did(text_run):
    config_file, run = text_run
    os.remove(run / workdir.DATA_RECORD)
    corpus = os.path.dirname(str(_get(config_file).data.source).removeprefix("text:"))
    _corpus_file(pathlib.Path(corpus) / "part2.txt", 2)
    runner.train(_get(config_file), str(run), stop_after=4)  # no record: no new refusal
    record = json.loads((run / workdir.DATA_RECORD).read_text())
    assert len(record["files"]) == 3  # from now on the corpus is checked


def _train_cli(config_file, run, *flags):
    import sys

    from tests.conftest import ROOT, subprocess_env

    return command_server.run(
        [sys.executable, "-m", "electra_jax.train", f"--config={config_file}", f"--workdir={run}"]
        + list(flags),
        cwd=ROOT,
        env=subprocess_env(),
        timeout=300,
    )


def _one_error_line(out) -> str:
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1, out.stderr[-3000:]
    return errors[0]


def test_the_command_line_refuses_a_changed_corpus_or_a_lost_config_in_one_line(text_run):
    config_file, run = text_run
    corpus = os.path.dirname(str(_get(config_file).data.source).removeprefix("text:"))
    _corpus_file(pathlib.Path(corpus) / "added.txt", 3)
    line = _one_error_line(_train_cli(config_file, run))
    assert "files added: added.txt" in line and "--allow_change=data.source" in line
    os.remove(os.path.join(corpus, "added.txt"))
    stored = (run / "config.json").read_bytes()
    os.remove(run / "config.json")
    line = _one_error_line(_train_cli(config_file, run))
    assert "config.json is missing" in line and "--allow_change=config.json" in line
    assert not (run / "config.json").exists()
    assert sorted(os.listdir(run / "checkpoints")) == ["3"]
    (run / "config.json").write_bytes(stored)


def test_a_corpus_moved_away_resumes_from_the_shards_its_record_proves(text_run, capsys):
    """The shards in the workdir are the rows the run started on: a resume reads them, says so,
    and trains what the uninterrupted run trains; without a proof it is refused."""
    config_file, run = text_run
    cfg = _get(config_file)
    corpus = os.path.dirname(str(cfg.data.source).removeprefix("text:"))
    os.rename(corpus, corpus + "-moved")
    before = {p: p.read_bytes() for p in (run.parent / "cache").rglob("*") if p.is_file()}
    runner.train(_get(config_file), str(run), stop_after=4)
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.splitlines() if "matches no files now" in ln]
    assert line.startswith(f"data.source '{cfg.data.source}' matches no files now; reading the")
    assert "which data_record.json proves complete and unchanged" in line
    assert [r["step"] for r in metrics_rows(run)][-1] == 4
    after = {p: p.read_bytes() for p in (run.parent / "cache").rglob("*") if p.is_file()}
    assert after == before  # read, not rewritten
    # evaluate reads the same rows (the held-out slice of the run's shards) the same way.
    from electra_jax import evaluate

    rows = evaluate.evaluate_workdir(str(run), steps=[4], heldout_examples=16)
    assert [r["step"] for r in rows] == [4] and "eval/disc_auc" in rows[0]
    assert "matches no files now; reading the shards" in capsys.readouterr().err

    # Another source, absent too: the record's shards are not its rows.
    other = _get(config_file)
    other.data.source = f"text:{corpus}-elsewhere/*.txt"
    with pytest.raises(ConfigError, match=r"\(the record's source differs from this run's\)"):
        runner.train(other, str(run), stop_after=5, allow_changes=("data.source",))
    # Unproven, refused in one line naming the record and the way out: a shard cut short ...
    (shard,) = (run.parent / "cache").glob("*/shard-00000.array_record")
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError) as e:
        runner.train(_get(config_file), str(run), stop_after=5)
    message = str(e.value)
    assert "cannot stand in for it (prepared shard" in message and "is damaged" in message
    assert "put the corpus back where data.source says" in message and "delete" not in message
    shard.write_bytes(data)
    # ... or a record of other rows than any prepared directory holds (another corpus's).
    record = json.loads((run / workdir.DATA_RECORD).read_text())
    record["fields"]["source_fingerprint"] = "0" * 64
    (run / workdir.DATA_RECORD).write_text(json.dumps(record))
    with pytest.raises(ConfigError, match="holds no complete prepared data"):
        runner.train(_get(config_file), str(run), stop_after=5)
    # Without a record there is nothing to stand in: the corpus is missing, as for a new run.
    os.remove(run / workdir.DATA_RECORD)
    with pytest.raises(DataError, match="matches no files; check the glob"):
        runner.train(_get(config_file), str(run), stop_after=5)


def metrics_rows(run) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
