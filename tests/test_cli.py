"""cli: what the commands share, one `error:` line and exit code 2, through a real absl app."""

import subprocess
import sys
import textwrap

import pytest

from electra_jax import cli
from tests.conftest import ROOT, subprocess_env

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
    return subprocess.run(
        [sys.executable, str(tmp_path / "app.py"), f"--config={tmp_path / 'config.py'}", *args],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


GOOD = """
import ml_collections
def get_config():
    return ml_collections.ConfigDict({"model": {"hidden_size": 64}})
"""


def test_a_good_config_and_its_overrides_reach_the_command(tmp_path):
    out = _run(tmp_path, GOOD, "--config.model.hidden_size=128")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == '{"model": {"hidden_size": 128}}'


@pytest.mark.parametrize(
    "config_text,args,expected",
    [
        (GOOD, ["--config.model.hiden_size=3"], "error: unknown config key --config.model.hiden"),
        (GOOD, ["--config.model.hidden_size=wide"], "error: "),
        ("def get_config(:\n", [], "is not valid Python"),
        ("x = 1\n", [], "has no get_config() function"),
        ("def get_config():\n    return {'a': 1}\n", [], "get_config() returned dict"),
    ],
)
def test_bad_config_input_is_one_line_and_exit_code_2(tmp_path, config_text, args, expected):
    out = _run(tmp_path, config_text, *args)
    assert out.returncode == 2, (out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines


def test_fail_and_cannot_write_say_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        cli.fail("data.source 'x' is not a known source")
    assert e.value.code == 2
    assert capsys.readouterr().err == "error: data.source 'x' is not a known source\n"
    error = OSError(28, "No space left on device", "/w/metrics.jsonl")
    assert cli.cannot_write(error, "then rerun") == (
        "cannot write /w/metrics.jsonl (No space left on device); free space or fix the "
        "storage, then rerun"
    )
    assert cli._flag_value(["p", "--config", "c.py"], "--config") == "c.py"
    assert cli._flag_value(["p", "--config=c.py:arg"], "--config") == "c.py:arg"
    assert cli._flag_value(["p"], "--config") is None
