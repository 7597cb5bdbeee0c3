"""cli: what the commands share, one `error:` line and exit code 2, through a real absl app."""

import asyncio
import logging
import os
import sys
import textwrap

import pytest

from electra_jax import cli
from tests import command_server
from tests.conftest import ROOT, error_line, load_config, run_command, run_python, subprocess_env

# A command as the package's are written: a config flag, parse_flags as absl's parser.
APP = textwrap.dedent(
    """
    import json
    from absl import app, flags
    from ml_collections import config_flags
    from electra_jax.cli import loaded_config, parse_flags

    _CONFIG = config_flags.DEFINE_config_file("config", None, "config file")
    flags.DEFINE_bool("verbose", False, "tracebacks")

    def main(argv):
        config = loaded_config(_CONFIG.value, flags.FLAGS["config"].config_filename)
        print(json.dumps(config.to_dict()))

    app.run(main, flags_parser=parse_flags)
    """
)


def _run(tmp_path, config_text: str, *args: str):
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "config.py").write_text(textwrap.dedent(config_text))
    return command_server.run(
        [sys.executable, str(tmp_path / "app.py"), f"--config={tmp_path / 'config.py'}", *args],
        cwd=ROOT,
        env=subprocess_env(),
        timeout=120,
    )


GOOD = """
import ml_collections
def get_config():
    return ml_collections.ConfigDict({"model": {"hidden_size": 64}})
"""


def test_a_good_config_and_its_overrides_reach_therun_command(tmp_path):
    out = _run(tmp_path, GOOD, "--config.model.hidden_size=128")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == '{"model": {"hidden_size": 128}}'


@pytest.mark.parametrize(
    "config_text,args,expected",
    [
        (
            GOOD,
            ["--config.model.hiden_size=3"],
            "error: unknown config key model.hiden_size (did you mean model.hidden_size?)",
        ),
        (GOOD, ["--config.model.hidden_size=wide"], "error: "),
        ("def get_config(:\n", [], "is not valid Python"),
        ("x = 1\n", [], "has no get_config() function"),
        ("def get_config():\n    return {'a': 1}\n", [], "get_config() returned dict"),
        (
            "def get_config():\n    return 1\n",
            ["--config.x=1"],
            "config.py: get_config() returned int",
        ),
    ],
)
def test_bad_config_input_is_one_line_and_exit_code_2(tmp_path, config_text, args, expected):
    out = _run(tmp_path, config_text, *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines


def _gcsfs_gives_up(error: Exception) -> None:
    """gcsfs's own retry wrapper (the one round every request of a gs:// workdir goes through),
    run once over a request that fails with `error`: it logs the traceback, then raises."""
    from gcsfs.retry import retry_request

    @retry_request(retries=1)
    async def request():
        raise error

    with pytest.raises(type(error)):
        asyncio.run(request())


def test_quiet_logs_drops_gcsfs_tracebacks_of_what_it_raises_and_nothing_else(caplog, monkeypatch):
    """A bucket the machine cannot reach: gcsfs logged the failed request's traceback, then
    raised the error that the command reports in its one line (104 lines before that line, for
    a gs:// workdir on a closed port). quiet_logs drops that echo and gcsfs's warning that a
    bucket's layout could not be asked; its other records still print."""
    from aiohttp import ClientConnectionError

    gcsfs_log = logging.getLogger("gcsfs")
    for name in ("gcsfs", "absl"):  # quiet_logs adds filters: this test's, not the worker's
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
    refused = ClientConnectionError("Connect call failed ('127.0.0.1', 9)")
    caplog.set_level(logging.WARNING)

    _gcsfs_gives_up(refused)  # without quiet_logs: the traceback is there
    echoed = [r for r in caplog.records if r.name == "gcsfs"]
    assert len(echoed) == 1 and echoed[0].exc_info and echoed[0].funcName == "retry_request"

    caplog.clear()
    cli.quiet_logs()
    _gcsfs_gives_up(refused)
    fallback = gcsfs_log.makeRecord(
        "gcsfs", logging.WARNING, "extended_gcsfs.py", 326,
        "Could not determine bucket type for bucket name b: ..., falling back to GCSFileSystem",
        None, None, func="_get_bucket_type",
    )  # fmt: skip
    gcsfs_log.handle(fallback)
    gcsfs_log.error("deferred close of %s failed", "gs://b/run/metrics.jsonl")
    kept = [r.getMessage() for r in caplog.records if r.name == "gcsfs"]
    assert kept == ["deferred close of gs://b/run/metrics.jsonl failed"]


# Runs a command as `python -m MODULE ARGS` would, and says at exit whether gcsfs's echoes were
# being dropped (quiet_logs ran) by the time the command ended.
_RUN_AND_TELL = """
import atexit, logging, runpy, sys
from electra_jax import cli
atexit.register(lambda: print(cli._not_gcsfs_echo in logging.getLogger("gcsfs").filters))
module = sys.argv.pop(1)
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(
    "module, args",
    [
        ("electra_jax.train", ["--config=configs/tiny.py"]),
        ("electra_jax.prepare", ["--config=configs/tiny.py"]),
        ("electra_jax.finetune", ["--config=configs/glue.py"]),
        ("electra_jax.evaluate", []),
        ("electra_jax.export", []),
    ],
)
def test_every_command_keeps_gcsfs_echoes_off_stderr(tmp_path, module, args):
    """Each command that can be given a gs:// path quiets the logs before its first answer: a
    --workdir that is a file (refused) ends in one `error:` line, with quiet_logs in force."""
    target = tmp_path / "notes.txt"
    target.write_text("notes")
    out = run_python("-c", _RUN_AND_TELL, module, *args, f"--workdir={target}", timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: "), out.stderr
    assert out.stdout.split() == ["True"], out.stdout


def test_one_line_for_ends_the_named_errors_in_one_line_and_lets_others_through(capsys):
    with pytest.raises(SystemExit) as ended, cli.one_line_for(KeyError, verbose=False):
        raise KeyError("config.x")
    assert ended.value.code == 2 and capsys.readouterr().err == "error: 'config.x'\n"
    with pytest.raises(KeyError), cli.one_line_for(KeyError, verbose=True):
        raise KeyError("config.x")  # --verbose: the traceback
    with pytest.raises(ValueError), cli.one_line_for(KeyError, verbose=False):
        raise ValueError("not bad input")
    assert capsys.readouterr().err == ""


def _raise(error: Exception):
    raise error


def test_a_request_without_an_answer_ends_a_command_in_one_line(capsys, monkeypatch):
    from electra_jax.store import deadline

    class TimeoutException(Exception):  # httpx's types: no OSError, no TimeoutError
        pass

    class ReadTimeout(TimeoutException):
        pass

    monkeypatch.delenv(deadline.TIMEOUT_ENV, raising=False)
    for raised, line in (
        (
            deadline.NoAnswer("gs://b/run/config.json", 60),
            "error: gs://b/run/config.json: no answer within 60s "
            f"({deadline.TIMEOUT_ENV}); check the network",
        ),
        (
            ReadTimeout("timed out"),
            "error: a request to a remote store got no answer (ReadTimeout: timed out); check",
        ),
    ):
        with pytest.raises(SystemExit) as ended:
            cli.run_to_the_end(lambda error=raised: _raise(error), verbose=False)
        err = capsys.readouterr().err
        assert ended.value.code == 2 and err.startswith(line) and err.count("\n") == 1, err
    with pytest.raises(ReadTimeout):  # --verbose: the traceback
        cli.run_to_the_end(lambda: _raise(ReadTimeout("t")), verbose=True)
    with pytest.raises(ValueError), cli.no_answer_ends(verbose=False):
        raise ValueError("no timeout")


def test_each_once_refuses_a_thing_named_twice_in_any_form(capsys):
    assert cli.each_once("--steps", ["3", "6"], key=int) == ["3", "6"]
    with pytest.raises(SystemExit) as ended:
        cli.each_once("--tasks", ["SST-2", "RTE", "SST-2"])
    assert ended.value.code == 2
    assert capsys.readouterr().err == "error: --tasks names 'SST-2' twice; name each once\n"
    with pytest.raises(SystemExit):
        cli.each_once("--steps", ["3", "03"], key=int)  # one checkpoint, two spellings
    assert capsys.readouterr().err == (
        "error: --steps names 3 (as '3' and '03') twice; name each once\n"
    )


def test_fail_and_cannot_write_say_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        cli.fail("data.source 'x' is not a known source")
    assert e.value.code == 2
    assert capsys.readouterr().err == "error: data.source 'x' is not a known source\n"
    error = OSError(28, "No space left on device", "/w/metrics.jsonl")
    assert cli.cannot_write(error, "then rerun") == (
        "cannot write /w/metrics.jsonl (No space left on device); free space on that disk (or "
        "raise the quota), then rerun"
    )


@pytest.mark.parametrize(
    "code,advice",
    [
        (21, "a folder stands where that file goes: move it away"),  # EISDIR
        (20, "a file stands where a folder of that path goes: move it away"),  # ENOTDIR
        (13, "make it writable (its permissions) or write elsewhere"),  # EACCES
        (30, "the filesystem is mounted read-only: write elsewhere"),  # EROFS
        (27, "raise the file size limit (ulimit -f) or use a filesystem without one"),  # EFBIG
        (5, "check the storage (its mount, its free space, its errors)"),  # EIO: unknown cause
    ],
)
def test_the_advice_of_a_failed_write_follows_its_errno(code, advice):
    """Never "free space" for a folder where a file goes, or for a permission."""
    line = cli.cannot_write(OSError(code, os.strerror(code), "/w/metrics.jsonl"), "then rerun")
    assert line == f"cannot write /w/metrics.jsonl ({os.strerror(code)}); {advice}, then rerun"
    assert cli._flag_value(["p", "--config", "c.py"], "--config") == "c.py"
    assert cli._flag_value(["p", "--config=c.py:arg"], "--config") == "c.py:arg"
    assert cli._flag_value(["p"], "--config") is None


def test_only_the_unknown_key_beside_valid_ones_is_named(tmp_path):
    line = error_line(
        _run(
            tmp_path,
            GOOD,
            "--config.model.hidden_size=9",
            "--config.model.hidden_siz=9",
            "--config.modle.hidden_size=9",
            "--config.model.zzz=1",
        ),
        only=True,
    )
    named = line.split("unknown config keys ", 1)[1]
    assert named.startswith(
        "model.hidden_siz (did you mean model.hidden_size?), modle.hidden_size (did you mean "
        "model.hidden_size?), model.zzz in "
    ), line
    assert "--config.model.hidden_size" not in line


BOOM = """
import ml_collections

def get_config():
    config = ml_collections.ConfigDict({"model": {"hidden_size": 64}})
    raise ValueError("boom")
"""


@pytest.mark.parametrize(
    "config_text,where",
    [
        (BOOM, "raised ValueError: boom (line 6, in get_config())"),
        (
            "import json\nraise RuntimeError('at import')\n",
            "RuntimeError: at import (line 2, at its top level)",
        ),
        (
            "import no_such_module_here\n",
            "ModuleNotFoundError: No module named 'no_such_module_here' (line 1",
        ),
    ],
)
def test_a_config_file_that_raises_is_named_with_its_error_and_line(tmp_path, config_text, where):
    line = error_line(_run(tmp_path, config_text, "--config.model.hidden_size=9"), only=True)
    assert line.startswith(f"error: config file {tmp_path / 'config.py'} "), line
    assert where in line, line
    verbose = _run(tmp_path, config_text, "--verbose")
    assert verbose.returncode != 0 and "Traceback" in verbose.stderr


@pytest.mark.parametrize(
    "module,config,args,expected",
    [
        ("electra_jax.train", "configs/glue.py", ["--dry_run"], "is a fine-tuning config"),
        ("electra_jax.train", "configs/squad.py", ["--workdir=W"], "is a fine-tuning config"),
        ("electra_jax.prepare", "configs/squad.py", ["--workdir=W"], "is a fine-tuning config"),
        ("electra_jax.finetune", "configs/tiny.py", ["--workdir=W"], "is a pre-training config"),
    ],
)
def test_a_config_of_the_other_family_names_which_command_takes_which(
    tmp_path, module, config, args, expected
):
    args = [a.replace("W", str(tmp_path / "w")) for a in args]
    line = error_line(run_command(module, f"--config={config}", *args), only=True)
    assert f"config file {config} {expected}" in line, line
    assert "electra_jax.finetune takes fine-tuning configs (configs/glue.py" in line, line
    assert "electra_jax.train and electra_jax.prepare take pre-training configs" in line, line
    assert not (tmp_path / "w").exists()  # refused before anything was created


def test_a_config_without_the_pretraining_sections_is_named(tmp_path):
    (tmp_path / "config.py").write_text(GOOD)
    line = error_line(
        only=True,
        out=run_command("electra_jax.train", f"--config={tmp_path / 'config.py'}", "--dry_run"),
    )
    assert "has no generator, data, train, objective, checkpoint, log sections" in line, line


def test_a_config_argument_get_config_does_not_take_is_one_line(tmp_path):
    (tmp_path / "config.py").write_text(GOOD)
    line = error_line(
        run_command("electra_jax.train", f"--config={tmp_path / 'config.py'}:big", "--dry_run"),
        only=True,
    )
    assert line == (
        f"error: config file {tmp_path / 'config.py'}:big: get_config() cannot be called as "
        "--config asks (TypeError: get_config() takes 0 positional arguments but 1 was given)"
    )


def test_a_config_lacking_keys_gets_the_schemas_defaults_and_a_family_keeps_its_own():
    config = load_config("tiny")
    with config.unlocked():
        del config.train["steps_per_call"]
        del config["compile"]
    done = cli.complete(config, finetuning=False)
    assert done.train.steps_per_call == 4 and done.compile.cache_dir == ""
    assert done.train.num_steps == config.train.num_steps  # what the file sets is kept
    glue = load_config("glue")
    with glue.unlocked():
        del glue["task"], glue["seed"]
    done = cli.complete(glue, finetuning=True)
    assert done.seed == 0 and "task" not in done  # the family's own: its check says so


def test_fail_is_the_last_line_even_with_a_coroutine_left_unawaited():
    """A failed save can leave one of orbax's coroutines unawaited; the interpreter's shutdown
    would warn about it under the error line (seen on a loaded machine)."""
    code = (
        "from electra_jax import cli\n"
        "async def save(): pass\n"
        "pending = save()\n"
        "cli.fail('a checkpoint could not be written')\n"
    )
    out = command_server.run([sys.executable, "-c", code], cwd=ROOT, env=subprocess_env())
    assert (out.returncode, out.stderr) == (2, "error: a checkpoint could not be written\n")
