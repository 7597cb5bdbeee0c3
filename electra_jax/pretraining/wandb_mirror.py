"""W&B: a run's metrics rows and config mirrored to Weights & Biases (`log.wandb_project`).

Optional (`pip install -e '.[wandb]'`); the metrics writer (metrics.py) hands every row it
writes to metrics.jsonl to `Mirror.log` too, on process 0 only. What W&B is sent:

- the run's config (config.json's settings), at the start; a resume with allowed changes updates
  it with the settings it goes on with;
- every metrics row, with its step as the `step` field and the x-axis of every chart
  (`define_metric`): a resumed run logs again from its checkpoint's step, which W&B's own
  step counter, always increasing, would drop. After a kill, the rows the killed start sent
  past that checkpoint stay in W&B, so the redone steps show twice there (docs/reliability.md);
  nothing is removed from W&B.

One W&B run per workdir: its id is kept in WORKDIR/wandb.json (written before `wandb.init`, so
that a run killed at any point resumes into the same one), and every start attaches to it
(`resume="allow"`). W&B's own files go under WORKDIR/wandb/start-N/, one per start (a gs://
workdir: W&B's default, ./wandb; WANDB_DIR, when set, wins). W&B's mode is the user's:
WANDB_MODE=offline keeps all on this machine for a later `wandb sync`, WANDB_MODE=disabled
turns it off for one command.

A dashboard must never cost the run: a W&B that cannot start or log is one warning line, and
the run goes on with metrics.jsonl and TensorBoard.
"""

from __future__ import annotations

import os
import secrets
from typing import Any

from electra_jax.run import workdir as workdir_lib
from electra_jax.store import jsonio, paths

# W&B's start and its final uploads end within these (seconds); a start that cannot is one
# warning line and the run goes on without the mirror.
INIT_TIMEOUT_SECONDS = 90.0
FINISH_TIMEOUT_SECONDS = 300.0


class Mirror:
    """An open W&B run that rows are logged to."""

    def __init__(self, run: Any, warn):
        self._run, self._warn = run, warn

    @classmethod
    def start(cls, workdir: str, config: Any, warn) -> Mirror | None:
        """The W&B run of `workdir` (`config`: the run's ConfigDict), created on the first start
        and resumed on every later one; None without `log.wandb_project`, or when W&B cannot
        start (said through `warn`, one line)."""
        project = str(config.log.wandb_project or "")
        if not project:
            return None
        try:
            # wandb: only on the path that uses it (an optional extra, or slow to import).
            import wandb

            record_path = paths.join(workdir, workdir_lib.WANDB_FILE)
            record = jsonio.read_json(record_path, OSError, {})
            run_id = record.get("id") if isinstance(record, dict) else None
            if not run_id:
                # W&B's ids are [a-z0-9]; made here rather than by W&B's helper, whose home in
                # its package moves between versions.
                run_id = secrets.token_hex(6)
                jsonio.write_json(record_path, {"id": run_id, "project": project})
            run = wandb.init(
                project=project,
                id=run_id,
                resume="allow",
                name=os.path.basename(paths.absolute(workdir).rstrip("/")),
                dir=_wandb_dir(workdir),
                config=config.to_dict(),
                # Our progress lines stay ours: W&B neither prints nor captures the terminal.
                # Stated deadlines (docs/reliability.md, "Every network call has a deadline"):
                # its start (W&B's own default, said here), and its uploads at the end, which by
                # default block until done; what they leave is in WORKDIR/wandb for `wandb sync`.
                settings=wandb.Settings(
                    silent=True,
                    console="off",
                    init_timeout=INIT_TIMEOUT_SECONDS,
                    finish_timeout=FINISH_TIMEOUT_SECONDS,
                ),
            )
            run.config.update(config.to_dict(), allow_val_change=True)  # a resume's changes
            run.define_metric("step")
            run.define_metric("*", step_metric="step")
        except Exception as e:  # noqa: BLE001 (W&B's errors: login, network, its service)
            warn(f"warning: W&B: cannot start the run ({jsonio.one_line(e, 200)}); metrics go "
                 "to metrics.jsonl and TensorBoard only")  # fmt: skip
            return None
        return cls(run, warn)

    def log(self, row: dict) -> None:
        """One metrics row ({'step': N, name: value or None}); a failure ends the mirroring."""
        if self._run is None:
            return
        try:
            self._run.log({k: v for k, v in row.items() if v is not None})
        except Exception as e:  # noqa: BLE001 (as at the start)
            self._warn(f"warning: W&B: logging failed ({jsonio.one_line(e, 200)}); no more rows "
                       "are sent this run (metrics.jsonl has them all)")  # fmt: skip
            self.close()

    def close(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            try:
                run.finish()
            except Exception as e:  # noqa: BLE001 (as at the start)
                self._warn(f"warning: W&B: cannot finish the run ({jsonio.one_line(e, 200)})")


def _wandb_dir(workdir: str) -> str | None:
    """Where W&B keeps this start's files: WANDB_DIR's choice when set; else a folder of this
    start's own under WORKDIR/wandb/ (W&B names its run folder by the second the run started, so
    two starts within one second would write one folder); for a gs:// workdir W&B's own default
    on this host."""
    if os.environ.get("WANDB_DIR") or paths.is_remote(workdir):
        return None
    base = os.path.join(workdir, workdir_lib.WANDB_DIR)
    os.makedirs(base, exist_ok=True)
    starts = sum(1 for name in os.listdir(base) if name.startswith("start-"))
    folder = os.path.join(base, f"start-{starts}")
    os.makedirs(folder)
    return folder
