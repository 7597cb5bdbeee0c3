"""A gs:// workdir end to end against a real GCS server (tests/gcs_emulator.py): train, prepare,
SIGKILL and resume with identical losses, SIGTERM, a second run refused, export, load, finetune."""

import json
import runpy
import signal
import sys

import numpy as np
import pytest

from electra_jax.pretraining import metrics, runner
from electra_jax.store import paths
from tests import command_server, held
from tests.conftest import ROOT, run_command, subprocess_env
from tests.finetune.test_loop import _sst2
from tests.hostile_inputs import _write_corpus
from tests.pretraining.test_runner import prepare_shared_data
from tests.test_preemption import LINE, _wait_for
from tests.test_preemption import _config_file as _shared_data_config


def _config_file(tmp_path, num_steps, every, data_lines=()):
    """The micro config on a small text corpus (a few seconds to prepare, where the builtin
    corpus takes tens), whose tokenizer and shards the run prepares in its workdir."""
    corpus = tmp_path / "corpus.txt"
    if not corpus.exists():
        _write_corpus(corpus)
    path = tmp_path / f"config_{num_steps}_{len(data_lines)}.py"
    path.write_text(
        "from tests.micro import micro_config\n\n\n"
        "def get_config():\n"
        "    c = micro_config()\n"
        f"    c.data.source = {'text:' + str(corpus)!r}\n"
        f"    c.train.num_steps, c.checkpoint.every_steps = {num_steps}, {every}\n"
        "    c.checkpoint.keep = 100\n"
        + "".join(f"    {line}\n" for line in data_lines)
        + "    return c\n"
    )
    return str(path)


def _cmd(module, *args):
    return [sys.executable, "-m", module, *args]


def _start(config, workdir, hold_dir=None, point=""):
    """`python -m electra_jax.train`; held at `point` (tests/held.py) when `hold_dir` is given."""
    args = ["electra_jax.train", f"--config={config}", f"--workdir={workdir}"]
    argv = held.command(hold_dir, point, *args) if hold_dir else _cmd(*args)
    return command_server.start(argv, ROOT, subprocess_env())


def _committed(workdir, step):
    # orbax on GCS writes a step in place and marks it done with commit_success.txt.
    return paths.exists(f"{workdir}/checkpoints/{step}/commit_success.txt")


def _losses(workdir):
    return [
        (r["step"], r["loss"], r["disc_loss"])
        for r in metrics.read_rows(f"{workdir}/metrics.jsonl")
    ]


@pytest.mark.slow
def test_a_gs_workdir_trains_resumes_exactly_after_sigkill_exports_loads_and_finetunes(
    gcs, tmp_path
):
    # The micro run's 6 steps (train.num_steps is part of the program: the suite's most
    # shared one), a checkpoint every 2.
    num_steps, every = 6, 2
    straight = f"{gcs}/straight"
    config = _config_file(tmp_path, num_steps, every)
    # prepare, then train: the tokenizer and shards go to the bucket (WORKDIR/data).
    out = run_command(
        "electra_jax.prepare", f"--config={config}", f"--workdir={straight}", timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert paths.isfile(f"{straight}/tokenizer/spm.model")
    [key] = paths.listdir(f"{straight}/data")
    assert paths.isfile(f"{straight}/data/{key}/manifest.json")
    # The reference run in this process (the commands' runs on a bucket follow).
    runner.train(runpy.run_path(config)["get_config"](), straight)
    expected = _losses(straight)
    assert [s for s, *_ in expected] == list(range(1, num_steps + 1))
    assert paths.isfile(f"{straight}/config.json") and paths.listdir(f"{straight}/tensorboard")
    saved = sorted(int(n) for n in paths.listdir(f"{straight}/checkpoints") if n.isdigit())
    assert saved == [2, 4, 6]

    # The same run again in another gs:// workdir, reading the first one's tokenizer and shards
    # in place; SIGKILLed after its second checkpoint, then rerun.
    killed = f"{gcs}/killed"
    config2 = _config_file(
        tmp_path,
        num_steps,
        every,
        [
            f"c.data.tokenizer = {straight + '/tokenizer/spm.model'!r}",
            f"c.data.cache_dir = {straight + '/data'!r}",
        ],
    )
    # Held after the step past the second checkpoint (whose save has started) until the kill:
    # the run cannot finish before it, however slow the polling of the bucket.
    (tmp_path / "hold").mkdir()
    proc = _start(config2, killed, tmp_path / "hold", f"step={2 * every + 1}")
    try:
        held.wait_held(tmp_path / "hold", proc)
        _wait_for(lambda: _committed(killed, 2 * every), proc, what="the second checkpoint")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    err = proc.stderr.read()
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    assert err.splitlines()[0].startswith("jax ") and " on cpu: " in err.splitlines()[0]
    rerun = _start(config2, killed)
    _, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err[-2000:]
    # The killed run's lock: its process on this host is gone, so it is taken over at once.
    assert "took over the lock" in err and "has ended" in err, err[-2000:]
    assert "resumed from checkpoint" in err
    assert _losses(killed) == expected

    # export to a local folder; load() reads the workdir itself and the export alike.
    hf = tmp_path / "hf"
    out = run_command("electra_jax.export", f"--workdir={killed}", f"--out={hf}", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert (hf / "discriminator" / "config.json").is_file()
    import electra_jax

    direct, exported = electra_jax.load(killed), electra_jax.load(str(hf))
    ids = direct.tokenize(["The chef cooked a meal."])
    np.testing.assert_allclose(
        direct.replaced_token_logits(ids), exported.replaced_token_logits(ids), atol=1e-5
    )

    # The held-out evaluation of its checkpoints, read from the bucket and written back there.
    out = run_command("electra_jax.evaluate", f"--workdir={killed}", "--steps=4,6", timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    printed = json.loads(out.stdout.splitlines()[-1])["rows"]
    assert [r["step"] for r in printed] == [4, 6]
    assert all(np.isfinite(r["eval/disc_loss"]) for r in printed)
    assert metrics.read_rows(f"{killed}/eval.jsonl") == printed

    # fine-tuning from the bucket, into the bucket.
    data = _sst2(tmp_path / "SST-2", n_train=16, n_dev=8)
    tuned = f"{gcs}/sst2"
    out = run_command(
        "electra_jax.finetune",
        "--config=configs/glue.py",
        f"--config.data_dir={data}",
        f"--config.init_from={killed}",
        "--config.num_epochs=1",
        "--config.batch_size=8",
        "--config.seq_length=32",
        f"--workdir={tuned}",
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert paths.isfile(f"{tuned}/eval_results.json") and paths.isfile(f"{tuned}/model.safetensors")
    record = json.loads(paths.read_bytes(f"{tuned}/model.json"))
    assert record["pretraining"]["path"] == killed and record["pretraining"]["step"] == num_steps
    # load() reads the model from the bucket and predicts what the run's dev predictions say.
    rows = [json.loads(x) for x in paths.read_text(f"{tuned}/dev_predictions.jsonl").splitlines()]
    texts = [ln.split("\t")[0].strip() for ln in (data / "dev.tsv").read_text().splitlines()[1:]]
    assert electra_jax.load(tuned).predict(texts).labels == [r["prediction"] for r in rows]


@pytest.mark.slow
def test_sigterm_saves_to_the_bucket_and_a_second_run_is_refused_meanwhile(
    gcs, tmp_path, tmp_path_factory
):
    # The shared data on the local disk (the bucket holds the workdir): nothing to prepare, and
    # test_preemption's program (its 10,000 steps).
    shared_data = prepare_shared_data(tmp_path_factory)
    config = _shared_data_config(tmp_path, shared_data, num_steps=10_000, every=4)
    workdir, hold_dir = f"{gcs}/w", tmp_path / "hold"
    hold_dir.mkdir()
    # Held after step 5 (the first checkpoint's save started) while the second run is refused
    # and until the SIGTERM has come: it stops at step 6, however fast the steps.
    proc = _start(config, workdir, hold_dir, "step=5")
    try:
        held.wait_held(hold_dir, proc)
        _wait_for(lambda: _committed(workdir, 4), proc, timeout=300, what="the first checkpoint")
        second = run_command(
            "electra_jax.train", f"--config={config}", f"--workdir={workdir}", timeout=120
        )
        assert second.returncode == 2, second.stderr[-2000:]
        lines = [ln for ln in second.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, second.stderr[-2000:]
        assert lines[0].startswith(f"error: --workdir {workdir} is in use by electra_jax.train")
        assert f"(pid {proc.pid} on host " in lines[0] and "its lease was renewed" in lines[0]
        proc.send_signal(signal.SIGTERM)
        held.release(hold_dir)
        _, err = proc.communicate(timeout=300)  # a guard against a hang
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    [line] = [ln for ln in err.splitlines() if ln.startswith("preempted at step")]
    step = int(line.split()[3].rstrip(";"))
    assert line == LINE.format(step) and step == 6  # honoured after the step after the hold
    assert _committed(workdir, step)
    assert metrics.read_rows(f"{workdir}/metrics.jsonl")[-1]["step"] == step
    # Released on the way out: the next run takes it without a word.
    assert json.loads(paths.read_bytes(f"{workdir}/.lock"))["released"] is True


@pytest.mark.slow
def test_a_finetuning_in_a_bucket_resumes_keeps_its_model_and_loads_as_a_local_one(gcs, tmp_path):
    import electra_jax
    from electra_jax.export import export
    from electra_jax.finetune import loop, predictor, saved
    from tests.finetune.test_saved import _glue, _without_time

    config = _glue(tmp_path)  # 12 steps, checkpoints every 4; a tokenizer trained for the run
    local = loop.finetune(config, str(tmp_path / "local"))
    tuned = f"{gcs}/sst2"
    stop = local["steps"] // 2 + 1
    assert loop.finetune(config, tuned, stop_after=stop)["stopped_at"] == stop
    assert _committed(tuned, stop) and not paths.exists(f"{tuned}/{saved.WEIGHTS_FILE}")
    results = loop.finetune(config, tuned)
    assert _without_time(results) == _without_time(local)
    assert (
        json.loads(paths.read_bytes(f"{tuned}/{saved.RESULTS_FILE}"))["metrics"]
        == (local["metrics"])
    )
    # The bucket keeps the model, and the same bytes as the run on a local disk.
    for name in (
        saved.WEIGHTS_FILE,
        saved.MODEL_FILE,
        "tokenizer/spm.model",
        "dev_predictions.jsonl",
    ):
        assert paths.read_bytes(f"{tuned}/{name}") == (tmp_path / "local" / name).read_bytes(), name
    # A finished run rerun returns its results and trains nothing.
    assert _without_time(loop.finetune(config, tuned)) == _without_time(local)

    model = electra_jax.load(tuned)
    assert isinstance(model, predictor.TextClassifier) and model.workdir == tuned
    assert model.evaluate()["metrics"] == results["metrics"]
    texts = [
        line.split("\t")[0].strip()
        for line in (tmp_path / "SST-2" / "dev.tsv").read_text().splitlines()[1:]
    ]
    rows = [json.loads(x) for x in paths.read_text(f"{tuned}/dev_predictions.jsonl").splitlines()]
    labels = model.predict(texts).labels
    assert labels == [r["prediction"] for r in rows]
    assert labels == electra_jax.load(str(tmp_path / "local")).predict(texts).labels

    # Exported from the bucket to a local folder: the local run's export, but for its source.
    manifest = export(tuned, str(tmp_path / "hf"))
    assert manifest["source"] == tuned and manifest["task"] == "SST-2"
    export(str(tmp_path / "local"), str(tmp_path / "hf-local"))
    for name in ("config.json", "model.safetensors", "spm.model", "tokenizer.json"):
        assert (tmp_path / "hf" / name).read_bytes() == (tmp_path / "hf-local" / name).read_bytes()


def test_a_finetuning_keeps_either_kind_of_tokenizer_in_a_bucket(gcs, tmp_path):
    from electra_jax.data.tokenizer import train_tokenizer
    from electra_jax.data.wordpiece import WordPieceTokenizer
    from electra_jax.finetune import saved

    words = ["the", "cat", "dog", "sat", "ran", "on", "a", "mat"]
    # A BERT vocab (fine-tuning Google's checkpoints), cased, and a SentencePiece model.
    wordpiece = WordPieceTokenizer(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, "##s"], do_lower_case=False
    )
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(words, 6)) for _ in range(200)]
    spm = train_tokenizer(sentences, str(tmp_path / "spm"), 20, 1.0, seed=0, sample_sentences=201)
    for name, tokenizer, files in (
        ("wp", wordpiece, ["tokenizer_config.json", "vocab.txt"]),
        ("spm", spm, ["spm.model", "spm.vocab"]),
    ):
        workdir = f"{gcs}/{name}"
        saved.save_tokenizer(tokenizer, workdir)
        assert sorted(paths.listdir(f"{workdir}/{saved.TOKENIZER_DIR}")) == files
        back = saved.load_tokenizer(workdir, tokenizer.fingerprint)
        assert type(back) is type(tokenizer) and back.fingerprint == tokenizer.fingerprint
        assert back.encode("the cats sat") == tokenizer.encode("the cats sat")
