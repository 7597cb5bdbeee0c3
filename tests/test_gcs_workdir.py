"""A gs:// workdir end to end against a real GCS server (tests/gcs_emulator.py): train, prepare,
SIGKILL and resume with identical losses, SIGTERM, a second run refused, export, load, finetune."""

import json
import signal
import subprocess
import sys

import numpy as np
import pytest

from electra_jax import metrics, paths
from tests.conftest import ROOT, subprocess_env
from tests.finetune.test_loop import _sst2
from tests.test_preemption import LINE, _wait_for


def _config_file(tmp_path, num_steps, every, data_lines=()):
    path = tmp_path / f"config_{num_steps}.py"
    path.write_text(
        "from tests.conftest import micro_config\n\n\n"
        "def get_config():\n"
        "    c = micro_config()\n"
        f"    c.train.num_steps, c.checkpoint.every_steps = {num_steps}, {every}\n"
        "    c.checkpoint.keep = 100\n"
        + "".join(f"    {line}\n" for line in data_lines)
        + "    return c\n"
    )
    return str(path)


def _cmd(module, *args):
    return [sys.executable, "-m", module, *args]


def _start(config, workdir):
    return subprocess.Popen(
        _cmd("electra_jax.train", f"--config={config}", f"--workdir={workdir}"),
        cwd=ROOT,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


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
    num_steps, every = 12, 3
    straight = f"{gcs}/straight"
    config = _config_file(tmp_path, num_steps, every)
    # prepare, then train: the tokenizer and shards go to the bucket (WORKDIR/data).
    out = subprocess.run(
        _cmd("electra_jax.prepare", f"--config={config}", f"--workdir={straight}"),
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert paths.isfile(f"{straight}/tokenizer/spm.model")
    [key] = paths.listdir(f"{straight}/data")
    assert paths.isfile(f"{straight}/data/{key}/manifest.json")
    ref = _start(config, straight)
    _, err = ref.communicate(timeout=300)
    assert ref.returncode == 0, err[-2000:]
    assert err.splitlines()[0].startswith("jax ") and " on cpu: " in err.splitlines()[0]
    expected = _losses(straight)
    assert [s for s, *_ in expected] == list(range(1, num_steps + 1))
    assert paths.isfile(f"{straight}/config.json") and paths.listdir(f"{straight}/tensorboard")
    assert sorted(int(n) for n in paths.listdir(f"{straight}/checkpoints") if n.isdigit()) == [
        3,
        6,
        9,
        12,
    ]

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
    proc = _start(config2, killed)
    try:
        _wait_for(lambda: _committed(killed, 2 * every), proc, what="the second checkpoint")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL, "finished before the kill"
    rerun = _start(config2, killed)
    _, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err[-2000:]
    # The killed run's lock: its process on this host is gone, so it is taken over at once.
    assert "took over the lock" in err and "has ended" in err, err[-2000:]
    assert "resumed from checkpoint" in err
    assert _losses(killed) == expected

    # export to a local folder; load() reads the workdir itself and the export alike.
    hf = tmp_path / "hf"
    out = subprocess.run(
        _cmd("electra_jax.export", f"--workdir={killed}", f"--out={hf}"),
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert (hf / "discriminator" / "config.json").is_file()
    import electra_jax

    direct, exported = electra_jax.load(killed), electra_jax.load(str(hf))
    ids = direct.tokenize(["The chef cooked a meal."])
    np.testing.assert_allclose(
        direct.replaced_token_logits(ids), exported.replaced_token_logits(ids), atol=1e-5
    )

    # fine-tuning from the bucket, into the bucket.
    data = _sst2(tmp_path / "SST-2", n_train=16, n_dev=8)
    tuned = f"{gcs}/sst2"
    out = subprocess.run(
        _cmd(
            "electra_jax.finetune",
            "--config=configs/glue.py",
            f"--config.data_dir={data}",
            f"--config.init_from={killed}",
            "--config.num_epochs=1",
            "--config.batch_size=8",
            "--config.seq_length=32",
            f"--workdir={tuned}",
        ),
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert paths.isfile(f"{tuned}/eval_results.json")
    assert paths.isfile(f"{tuned}/dev_predictions.jsonl")


@pytest.mark.slow
def test_sigterm_saves_to_the_bucket_and_a_second_run_is_refused_meanwhile(gcs, tmp_path):
    config = _config_file(tmp_path, 10_000, 4)
    workdir = f"{gcs}/w"
    proc = _start(config, workdir)
    try:
        _wait_for(lambda: _committed(workdir, 4), proc, timeout=300, what="the first checkpoint")
        second = subprocess.run(
            _cmd("electra_jax.train", f"--config={config}", f"--workdir={workdir}"),
            cwd=ROOT,
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 2, second.stderr[-2000:]
        lines = [ln for ln in second.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, second.stderr[-2000:]
        assert lines[0].startswith(f"error: --workdir {workdir} is in use by electra_jax.train")
        assert f"(pid {proc.pid} on host " in lines[0] and "its lease was renewed" in lines[0]
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    [line] = [ln for ln in err.splitlines() if ln.startswith("preempted at step")]
    step = int(line.split()[3].rstrip(";"))
    assert line == LINE.format(step) and step >= 4
    assert _committed(workdir, step)
    assert metrics.read_rows(f"{workdir}/metrics.jsonl")[-1]["step"] == step
    # Released on the way out: the next run takes it without a word.
    assert json.loads(paths.read_bytes(f"{workdir}/.lock"))["released"] is True
