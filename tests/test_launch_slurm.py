"""launch/slurm.sbatch run as SLURM runs it (bash), its srun line through a fake `srun` that
starts 2 tasks on this machine with SLURM's variables, and `python -m electra_jax.train` replaced by
a stub that records what each task asks jax for: the launch electra_jax.pretraining.cluster detects
(jax's SlurmCluster) and the GPUs the task can see; then the tasks join as train.py joins them (on
CPU). jax is started in each task with the script's XLA_FLAGS, which aborts on a flag this jaxlib
does not know. No training."""

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys

from tests.conftest import ROOT, subprocess_env

SCRIPT = ROOT / "launch" / "slurm.sbatch"

# What srun gives each task of a 1-node step of `--ntasks-per-node=2 --gpus-per-node=2`:
# SLURM's variables, and the node's two GPUs (CUDA_VISIBLE_DEVICES of the job's gres).
FAKE_SRUN = r"""#!/usr/bin/env bash
printf '%s\n' "$*" >> "$FAKE_LOG/srun.calls"
printf '%s\n' "$JAX_COMPILATION_CACHE_DIR" >> "$FAKE_LOG/srun.cache"
[[ -n "${FAKE_NO_TASKS:-}" ]] && exit 0
while [[ "$1" == -* ]]; do shift; done
pids=()
for i in 0 1; do
  SLURM_JOB_ID=77 SLURM_JOB_NODELIST=localhost SLURM_STEP_NODELIST=localhost SLURM_NTASKS=2 \
  SLURM_STEP_NUM_NODES=1 SLURM_NODEID=0 SLURM_PROCID=$i SLURM_LOCALID=$i \
  CUDA_VISIBLE_DEVICES=0,1 "$@" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=$?; done
exit $status
"""

# `python -m electra_jax.train ARGS` in a task: its argv, its environment's launch variables, and
# the launch train.py would start (electra_jax.pretraining.cluster.detect, jax's own SLURM
# detection).
STUB = """
import json, os, sys
from absl import flags
import jax
from electra_jax import train
from electra_jax.pretraining import cluster
from jax.experimental import multihost_utils

# The script's variables are exported; a task's own come from srun. jax starts with them
# (XLA_FLAGS aborts here on an unknown flag).
launch = cluster.detect(timeout_seconds=5)
# Then the tasks join for real, as train.py joins them, and gather each one's index.
flags.FLAGS(["train", "--peer_timeout_seconds=6"], known_only=True)
train._maybe_initialize_distributed()
gathered = multihost_utils.process_allgather(jax.numpy.array([jax.process_index()]))
out = dict(
    argv=sys.argv[1:],
    visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
    xla_flags=os.environ.get("XLA_FLAGS", ""),
    cache=os.environ.get("JAX_COMPILATION_CACHE_DIR"),
    launch=launch.initialize_kwargs() if launch else None,
    joined=[jax.process_count(), gathered.ravel().tolist()],
)
path = os.path.join(os.environ["FAKE_LOG"], "task_" + os.environ["SLURM_PROCID"] + ".json")
with open(path, "w") as f:
    json.dump(out, f)
"""


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _tool(path, text):
    path.write_text(text)
    path.chmod(0o755)


def _run(tmp_path, *args, **env):
    bin_dir, log = tmp_path / "bin", tmp_path / "log"
    bin_dir.mkdir(parents=True)
    log.mkdir()
    _tool(bin_dir / "srun", FAKE_SRUN)
    (tmp_path / "stub.py").write_text(STUB)
    # Only `python -m electra_jax.train` is replaced; anything else runs the real python.
    _tool(
        bin_dir / "python",
        "#!/usr/bin/env bash\n"
        'if [[ "$1 $2" == "-m electra_jax.train" ]]; then shift 2; '
        f'exec {shlex.quote(sys.executable)} {shlex.quote(str(tmp_path / "stub.py"))} "$@"; fi\n'
        f'exec {shlex.quote(sys.executable)} "$@"\n',
    )
    full = subprocess_env()
    for key in [k for k in full if k.startswith(("SLURM_", "CUDA_VISIBLE"))]:
        del full[key]
    full.pop("JAX_COMPILATION_CACHE_DIR", None)
    full.pop("XLA_FLAGS", None)
    full.update(env, FAKE_LOG=str(log), JAX_PLATFORMS="cpu")
    full["PATH"] = f"{bin_dir}{os.pathsep}{full['PATH']}"
    # Its own session: a task left behind (a failed join) is killed with the script.
    proc = subprocess.Popen(
        ["bash", str(SCRIPT), *args],
        env=full,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    out = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    tasks = [json.loads(p.read_text()) for p in sorted(log.glob("task_*.json"))]
    calls = [
        (log / f"srun.{what}").read_text().splitlines() if (log / "srun.calls").exists() else []
        for what in ("calls", "cache")
    ]
    return out, calls, tasks


def test_each_task_asks_jax_for_a_gpu_it_can_see(tmp_path):
    args = ["--config=configs/large.py", "--workdir=/shared/runs/large", "--config.seed=3"]
    # SLURM's port for jax is the job id's; here a free one, through jax's own override.
    port = _free_port()
    out, (calls, _), tasks = _run(
        tmp_path, *args, XLA_FLAGS="--xla_dump_hlo_as_text", JAX_COORDINATOR_PORT=port
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert calls == [f"--kill-on-bad-exit=1 python -m electra_jax.train {' '.join(args)}"]
    assert len(tasks) == 2
    for i, task in enumerate(tasks):
        assert task["argv"] == args
        launch = task["launch"]
        assert launch["num_processes"] == 2 and launch["process_id"] == i
        assert launch["coordinator_address"] == f"localhost:{port}"
        # The GPU jax asks for is an index among the ones the task sees.
        visible = task["visible"].split(",")
        assert launch["local_device_ids"] == [i] and i < len(visible), task
        flags = task["xla_flags"].split()
        assert "--xla_gpu_enable_latency_hiding_scheduler=true" in flags
        assert flags[-1] == "--xla_dump_hlo_as_text"  # the user's own come last, and win
        assert task["cache"] == "/shared/runs/jax_compilation_cache"
        assert task["joined"] == [2, [0, 1]]  # one run of both tasks
    assert tasks[0]["launch"]["coordinator_address"] == tasks[1]["launch"]["coordinator_address"]


def test_a_cache_dir_given_is_kept_and_a_missing_workdir_is_usage(tmp_path):
    args = ("--config=c.py", "--workdir=gs://b/runs/x")
    out, (_, cache), _ = _run(tmp_path / "a", *args, FAKE_NO_TASKS="1")
    assert out.returncode == 0 and cache == ["gs://b/runs/jax_compilation_cache"], out.stderr
    out, (_, cache), _ = _run(
        tmp_path / "b", *args, FAKE_NO_TASKS="1", JAX_COMPILATION_CACHE_DIR="/c"
    )
    assert out.returncode == 0 and cache == ["/c"], out.stderr
    out = subprocess.run(["bash", str(SCRIPT), "--config=c.py"], capture_output=True, text=True)
    assert out.returncode == 2 and out.stderr.startswith("usage: sbatch")
