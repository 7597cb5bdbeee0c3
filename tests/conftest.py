"""Shared fixtures: tiny configs and specs that compile in seconds on 2 CPU cores."""

import ast
import collections
import fcntl
import os
import pathlib
import runpy
import sys
import tempfile
from collections.abc import Callable

# One persistent compilation cache for the whole suite, its workers and the commands it starts
# (they inherit the environment): the tests compile the same few micro programs over and over,
# in-process and in subprocesses, and loading one takes a fraction of compiling it. A loaded
# executable is the compiled one, so the numbers are the same. Compile time dominates these tiny
# models, and XLA's heavy passes buy nothing here. Set in the environment rather than through
# jax.config, so that pytest's own process, which runs no test, never imports jax.
_SUITE_CACHE = os.path.join(tempfile.gettempdir(), f"electra_jax-tests-jax-cache-{os.getuid()}")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _SUITE_CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
# The suite runs on CPU. With libtpu installed (the test extra, for the compiles for a named
# slice), every process that starts jax would first try a TPU and wait for libtpu to give up
# (about 0.3 s a process: test_train_cli and test_export took 64-66 s with this against 68-76 s
# without, side by side); the compile-only devices of --topology need no TPU backend.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Where Python may not write bytecode (PYTHONDONTWRITEBYTECODE, as on some CI machines), pytest
# cannot keep its rewrite of the test modules' asserts either, and each worker rewrote all of
# them at every start (3.5 s of its collection on 2 cores). Collection keeps them, and the
# bytecode of what the test modules import, here instead, beside the compilation cache.
_SUITE_BYTECODE = os.path.join(tempfile.gettempdir(), f"electra_jax-tests-pyc-{os.getuid()}")

import pytest  # noqa: E402

from tests import collector, command_server  # noqa: E402
from tests.gcs_emulator import gcs, gcs_server  # noqa: E402, F401  (the GCS server's fixtures)
from tests.micro import micro_config  # noqa: E402, F401  (tests import it from here)
from tests.silent_servers import half_answering_hub, silent_address  # noqa: E402, F401

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


def drop_cut_cache_entries(cache_dir: str) -> list[str]:
    """Removes the entries of the compilation cache at `cache_dir` that end before their zlib
    stream does (a process killed, or past a file size limit, while jax wrote one); returns
    their names. jax reads such an entry, warns, compiles, and does not replace it (it never
    rewrites a key it finds), so one cut entry makes that program miss for good."""
    import zlib

    cut = []
    for name in sorted(os.listdir(cache_dir)) if os.path.isdir(cache_dir) else []:
        path = os.path.join(cache_dir, name)
        if not name.endswith("-cache") or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if data[:4] == b"\x28\xb5\x2f\xfd":  # zstd (jax's choice where zstandard is installed)
            continue
        stream = zlib.decompressobj()
        try:
            stream.decompress(data)
            whole = stream.eof
        except zlib.error:
            whole = False
        if not whole:
            os.remove(path)
            cut.append(name)
    return cut


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    if not sys.dont_write_bytecode:
        return (yield)
    prefix = sys.pycache_prefix
    sys.dont_write_bytecode, sys.pycache_prefix = False, _SUITE_BYTECODE
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode, sys.pycache_prefix = True, prefix


def pytest_configure(config):
    # Once per session, in the process that starts the workers (they carry `workerinput`):
    # an entry cut short in an earlier session would cost a compile in every test that meets it.
    # Only in the suite's own cache: a cache the environment names is someone else's folder.
    in_own = os.environ["JAX_COMPILATION_CACHE_DIR"] == _SUITE_CACHE
    if in_own and not hasattr(config, "workerinput"):
        drop_cut_cache_entries(_SUITE_CACHE)


def pytest_collection_finish(session):
    collector.settle()  # the test modules and what they import are in memory for good


@pytest.hookimpl(trylast=True)  # after pytest's own grouping of tests by fixture
def pytest_collection_modifyitems(items):
    # With --dist=worksteal (pyproject.toml) each worker starts on half of this list and one that
    # runs out takes the second half of what the other has left, so the two meet inside the
    # list; the run ends well when they meet on short tests. Hence the end-to-end runs (marked
    # slow, 10-60 s each) first, so that they start early, and among them the modules with a
    # table of many short cases (the hostile inputs) last. A module's other tests keep their
    # order, so its fixtures are made once.
    items[:] = slow_first(items)


def slow_first(items: list) -> list:
    """`items` with those marked slow moved to the front, those of modules with fewer slow tests
    first; each module's tests keep their order, and so do the tests not marked slow."""
    slow = [i for i in items if i.get_closest_marker("slow")]
    per_module = collections.Counter(_module(i) for i in slow)
    slow.sort(key=lambda i: per_module[_module(i)])  # a stable sort: each module's order kept
    return slow + [i for i in items if not i.get_closest_marker("slow")]


def _module(item) -> str:
    return item.nodeid.split("::")[0]


def built_once(tmp_path_factory, name: str, build: Callable[[pathlib.Path], None]):
    """The folder `name`, made by `build(folder)` once per test run and shared by its xdist
    workers: whichever asks first builds it while the others wait on a file lock, and all read
    it (never write it) afterwards. A build that failed is not tried again: the next to ask
    raises, pointing at the first one's error."""
    base = tmp_path_factory.getbasetemp()
    # Under xdist each worker's basetemp is a folder of the run's own; their parent is shared.
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    built = shared / name
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other worker waits here while one builds
        if not (built / "READY").exists():
            if built.exists():
                raise RuntimeError(f"building {built} failed in another test (see its error)")
            built.mkdir()
            build(built)
            (built / "READY").touch()
    return built


def load_config(name: str):
    return runpy.run_path(str(ROOT / "configs" / f"{name}.py"))["get_config"]()


@pytest.fixture
def micro():
    return micro_config()


def subprocess_env(devices: int | None = None) -> dict:
    env = dict(os.environ)  # with this process's jax settings (above): the same numbers
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if devices:
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    return env


# Sets RLIMIT_FSIZE in a fresh, single-threaded interpreter, then becomes the command (argv[2:]).
# Not subprocess's preexec_fn: that runs Python in the child of a fork of this multithreaded
# process (jax's threads), where a lock another thread held at the fork (the import lock,
# malloc's) is never released and the child can hang. The command reads the shared compilation
# cache but writes nothing to it (jax writes only programs that took at least
# jax_persistent_cache_min_compile_time_secs to compile): under the limit, jax would write a new
# program's entry cut short, and jax never rewrites an entry it finds, so every later compile of
# that program in the suite would miss. Reading keeps the command's compiles as cheap as the
# suite's other runs (without the cache, each launch compiled the train step anew).
_FILE_SIZE_LIMIT = (
    "import os, resource, sys; n = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_FSIZE, (n, n)); "
    "os.execve(sys.argv[2], sys.argv[2:], "
    "{**os.environ, 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '1e12'})"
)


def with_file_size_limit(argv: list[str], limit: int) -> list[str]:
    """`argv` run under RLIMIT_FSIZE = `limit` bytes, a stand-in for a full disk: a write past
    it fails with EFBIG (Python ignores SIGXFSZ). argv[0] is an executable's path. The command
    reads the persistent compilation cache and writes nothing to it (see _FILE_SIZE_LIMIT)."""

    return [sys.executable, "-c", _FILE_SIZE_LIMIT, str(limit), *argv]


# What a command's early refusals must not wait for: seconds of imports.
HEAVY_MODULES = ("jax", "flax", "orbax", "grain")

# Runs `python -m MODULE ARGS` in this interpreter (argv after -c: MODULE, ARGS) and prints its
# exit code, then which of HEAVY_MODULES it had imported by then.
_IMPORTED_AT_EXIT = f"""
import runpy, sys
module = sys.argv[1]
sys.argv = [module, *sys.argv[2:]]
try:
    runpy.run_module(module, run_name="__main__")
except SystemExit as e:
    print(e.code, sorted(set({HEAVY_MODULES!r}) & set(sys.modules)))
"""


def heavy_imports_at_exit(module: str, *args: str) -> tuple[str, str]:
    """`python -m module args...` from the repository root, in a fresh interpreter: (stdout's
    first line, 'CODE [the heavy modules imported]', e.g. "2 []"; stderr)."""
    out = run_python("-c", _IMPORTED_AT_EXIT, module, *args, timeout=120, fresh=True)
    return out.stdout.split("\n")[0], out.stderr


# The modules that import none of HEAVY_MODULES, listed once: the commands, what they check and
# read before the heavy imports (so that bad input is answered in a blink), and what prepare's
# worker processes and the Python API's first import read. tests/test_jax_free.py holds them to it;
# every other module of the package may import jax at its top.
JAX_FREE_MODULES = (
    "electra_jax",
    "electra_jax.cli",
    "electra_jax.errors",
    *command_server.COMMANDS,
    "electra_jax.validate",
    "electra_jax.config.describe",
    "electra_jax.config.finetune_keys",
    "electra_jax.config.groups",
    "electra_jax.config.pretrain_keys",
    "electra_jax.config.schema",
    "electra_jax.data",
    "electra_jax.data.heldout",
    "electra_jax.data.mixture",
    "electra_jax.data.packing",
    "electra_jax.data.progress",
    "electra_jax.data.shards",
    "electra_jax.data.sources",
    "electra_jax.data.tokenizer",
    "electra_jax.data.wordpiece",
    "electra_jax.finetune.checks",
    "electra_jax.finetune.family",
    "electra_jax.finetune.features",
    "electra_jax.finetune.glue_metrics",
    "electra_jax.finetune.inputs",
    "electra_jax.finetune.prior_run",
    "electra_jax.finetune.reading",
    "electra_jax.finetune.squad_data",
    "electra_jax.finetune.squad_eval",
    "electra_jax.finetune.tasks",
    "electra_jax.hf.card",
    "electra_jax.hf.hub",
    "electra_jax.hf.previous",
    "electra_jax.hf.task_heads",
    "electra_jax.hf.tokenizer_files",
    "electra_jax.model.weights",
    "electra_jax.objectives.catalog",
    "electra_jax.pretraining.cluster",
    "electra_jax.pretraining.resume",
    "electra_jax.pretraining.timing",
    "electra_jax.pretraining.topology",
    "electra_jax.pretraining.wandb_mirror",
    "electra_jax.run.rerun",
    "electra_jax.run.workdir",
    "electra_jax.store.checkpoint_steps",
    "electra_jax.store.filenames",
    "electra_jax.store.gcs_lock",
    "electra_jax.store.jsonio",
    "electra_jax.store.paths",
)


def heavy_imports_of(*modules: str) -> list[str]:
    """Which of HEAVY_MODULES importing `modules` imports, in a fresh interpreter (this one has
    them already): what a command's early refusals rely on being []."""
    code = (
        f"import sys; import {', '.join(modules)}; "
        f"print(sorted(set({HEAVY_MODULES!r}) & set(sys.modules)))"
    )
    out = run_python("-c", code, fresh=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return ast.literal_eval(out.stdout.strip())


def run_python(*args: str, timeout: float = 180, file_size_limit: int = 0, fresh: bool = False):
    """`python args...` (this interpreter) from the repository root, with subprocess_env: the
    finished process (returncode, stdout, stderr as text). Forked from the suite's warm
    interpreter (tests/command_server.py) unless `fresh`. `file_size_limit` > 0: under that
    file size limit (`with_file_size_limit`)."""
    argv = [sys.executable, *args]
    if file_size_limit:  # fresh: the limit would hold for the files the server's child writes to
        argv, fresh = with_file_size_limit(argv, file_size_limit), True
    return command_server.run(argv, ROOT, subprocess_env(), timeout=timeout, fresh=fresh)


def run_command(
    module: str, *args: str, timeout: float = 180, file_size_limit: int = 0, fresh: bool = False
):
    """`python -m module args...` as a user runs it, from the repository root: the finished
    process (returncode, stdout, stderr as text); run_python's `file_size_limit` and `fresh`."""
    return run_python(
        "-m", module, *args, timeout=timeout, file_size_limit=file_size_limit, fresh=fresh
    )


def micro_config_file(path, shared_data) -> str:
    """A config file at `path` for the commands: the micro config reading the shared tokenizer
    and prepared data (tests/pretraining/test_runner.py's shared_data: (tokenizer, cache dir))."""
    tokenizer, cache_dir = shared_data
    path.write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT)!r})\nfrom tests.micro import micro_config\n\n"
        "def get_config():\n    config = micro_config()\n"
        f"    config.data.tokenizer, config.data.cache_dir = {tokenizer!r}, {cache_dir!r}\n"
        "    return config\n"
    )
    return str(path)


def error_line(out, only: bool = False) -> str:
    """The `error:` line a refused command ends with (exit code 2, no traceback); with `only`,
    checked to be all it printed on stderr."""
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), lines
    assert not only or len(lines) == 1, lines
    return lines[-1]
