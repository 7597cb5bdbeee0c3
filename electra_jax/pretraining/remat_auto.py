"""train.remat='auto': the fastest remat policy whose step fits the devices, chosen by compiling.

Before anything is allocated, the run compiles its step ahead of time for its own devices with
the policies of ORDER, fastest first ('none', the named policies, 'full' last: each recomputes
more of a layer in the backward pass and keeps less of it), and takes the first whose memory
per device (XLA's memory_analysis: arguments + outputs - aliases + temporaries, as
fit.memory counts it) fits the device's: on TPU the chip's HBM (topology.py's table), on GPU
the allocator's limit (device.memory_stats()['bytes_limit']). Where no limit is known (CPU) it
takes 'none' without compiling, and says so. One line names the choice and why; the chosen
policy's compiled program is the one the run then calls (program.StepSetup.compiled), not
compiled twice. No choice fitting is one line naming the settings to change (NothingFits).

A run records its choice in WORKDIR/remat_choice.json (filenames.REMAT_RECORD) with what it was
made for: the devices (kind, count, memory per device), the settings that shape the step's
memory (RECORDED_SETTINGS) and the jax version. A restart on the same devices with the same
settings takes the recorded policy without compiling the candidates; otherwise it chooses again,
with one line saying what changed. The record is written atomically by process 0 and read
defensively: a damaged one is named in one line and the choice made again.

The ranking of ORDER is measured: benchmarks/notes/remat.md (the TPU compiler's estimated cycles
and the memory of one base and one large layer under each policy).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from electra_jax.config import pretrain_keys
from electra_jax.errors import ConfigError
from electra_jax.pretraining import topology
from electra_jax.store import filenames, jsonio, paths

AUTO = "auto"

# The candidates, fastest first: fewest estimated cycles of one base and one large layer,
# forward and backward, by the TPU compiler for TPU v4 (the same order for both;
# benchmarks/notes/remat.md). Each keeps less than the one before. Left out: 'dots', slower than
# 'save_qkv_ffn' for more memory; 'offload_probs', whose copies to and from the host the
# compiler's estimate does not price as a chip's host link would (not measured on a TPU).
ORDER = ("none", "save_matmuls", "save_projections", "save_qkv_ffn", "full")

# The settings besides the devices that shape the step's memory per device: a resume that
# changes one chooses again.
RECORDED_SETTINGS = tuple(k.name for k in pretrain_keys.KEYS if k.memory)
_FORMAT = 1


class NothingFits(ConfigError):
    """train.remat='auto' found no policy whose step fits the devices' memory."""


@dataclasses.dataclass(frozen=True)
class Trial:
    """One candidate compiled: its memory per device in bytes (where the compiler refused it
    for want of memory, `refused`, the temporaries it said it needs, or None), whether that
    fits, and its compiled program (kept only when it fits)."""

    policy: str
    need_bytes: int | None
    fits: bool
    refused: bool = False
    compiled: Any = dataclasses.field(default=None, repr=False, compare=False)


@dataclasses.dataclass(frozen=True)
class Choice:
    """The policy chosen, the line that says why, the candidates compiled (none where no limit
    is known, or the choice came from the workdir's record), the chosen one's compiled program
    (None where nothing was compiled) and the seconds the compiles took."""

    policy: str
    line: str
    trials: tuple[Trial, ...] = ()
    compiled: Any = dataclasses.field(default=None, repr=False, compare=False)
    seconds: float = 0.0


def _gib(n: float) -> str:
    return f"{n / topology.GIB:.2f} GiB"


def _trial_text(t: Trial) -> str:
    if not t.refused:
        return f"{t.policy!r} {_gib(t.need_bytes)}"
    if t.need_bytes is None:
        return f"{t.policy!r} more than the compiler can place (XLA: RESOURCE_EXHAUSTED)"
    return f"{t.policy!r} {_gib(t.need_bytes)} of temporaries alone (XLA: RESOURCE_EXHAUSTED)"


def choose(
    measure: Callable[[str], tuple[int | None, Any]],
    limit_bytes: int,
    where: str,
    hint: str,
    order: Sequence[str] = ORDER,
) -> Choice:
    """The first policy of `order` whose memory fits `limit_bytes` per device.

    measure(policy) -> (bytes per device, compiled program), or (the temporaries XLA said it
    needs, or None; None) where the compiler refused the program for want of memory; it is
    called in order and not past the first fit. `where`: the devices, in words ('64 x TPU
    v4'); `hint`: what else could make a step fit (fit.fix_hint), for NothingFits, raised
    when no policy fits.
    """
    trials = []
    for policy in order:
        need, compiled = measure(policy)
        refused = compiled is None
        fits = not refused and need is not None and need <= limit_bytes
        # A program that does not fit is let go (an executable holds memory on its devices).
        trials.append(Trial(policy, need, fits, refused, compiled if fits else None))
        if fits:
            break
    each = f"{where} ({_gib(limit_bytes)} each)"
    if not trials[-1].fits:
        needs = ", ".join(_trial_text(t) for t in trials)
        raise NothingFits(f"train.remat=auto: no policy fits {each}: {needs}; try {hint}")
    chosen = trials[-1]
    why = f"{_trial_text(chosen)} fits"
    if len(trials) > 1:
        verb = "does not fit" if len(trials) == 2 else "do not fit"
        why = f"{', '.join(_trial_text(t) for t in trials[:-1])} {verb}; {why}"
    line = f"train.remat=auto: {chosen.policy!r} for {each}: {why}"
    return Choice(chosen.policy, line, tuple(trials), chosen.compiled)


def device_memory(devices: Sequence[Any]) -> tuple[int | None, str]:
    """(bytes of memory per device, or None where none is known; the devices in words).

    TPU: the chip generation's HBM per device (topology.GENERATIONS; compile-only devices have
    no allocator to ask); GPU: the allocator's bytes_limit where it reports one; else None."""
    device = devices[0]
    where = f"{len(devices)} x {device.device_kind}"
    if device.platform == "tpu":
        generation = topology.generation_for_kind(device.device_kind)
        return (generation.hbm_bytes_per_device if generation else None), where
    if device.platform in ("gpu", "cuda", "rocm"):
        try:
            stats = device.memory_stats() or {}
        except Exception:  # a backend without the call: no limit known
            stats = {}
        limit = stats.get("bytes_limit")
        return (int(limit) if limit else None), where
    return None, where


def with_policy(config, policy: str):
    """A copy of `config` with train.remat=`policy`."""
    resolved = copy.deepcopy(config)
    with resolved.unlocked():
        resolved.train.remat = policy
    return resolved


# ------------------------------------------------------------------------ the workdir's record


def _made_for(config, mesh) -> dict:
    """What a choice is made for: the devices, the settings that shape memory, jax's version."""
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    import jax

    devices = list(mesh.devices.flat)
    memory, _ = device_memory(devices)
    return {
        "devices": {
            "kind": devices[0].device_kind,
            "count": len(devices),
            "memory_per_device_bytes": memory,
        },
        "settings": {k: _get(config, k) for k in RECORDED_SETTINGS},
        "jax": jax.__version__,
    }


def _get(config, dotted: str):
    section, key = dotted.split(".")
    return config[section][key]


def _changes(then: dict, now: dict) -> list[str]:
    """What differs between two `_made_for`s, in words."""
    out = []
    old_d, new_d = then.get("devices") or {}, now["devices"]
    if old_d != new_d:

        def text(d):
            memory = d.get("memory_per_device_bytes")
            each = f" of {_gib(memory)}" if isinstance(memory, int) else ""
            return f"{d.get('count')} x {d.get('kind')}{each}"

        out.append(f"devices {text(old_d)} then, {text(new_d)} now")
    old_s = then.get("settings") or {}
    for key, value in now["settings"].items():
        if old_s.get(key) != value:
            out.append(f"{key}={old_s.get(key)!r} then, {value!r} now")
    if then.get("jax") != now["jax"]:
        out.append(f"jax {then.get('jax')} then, {now['jax']} now")
    return out


def read_record(path: str, log: Callable[[str], None]) -> dict | None:
    """The record at `path`, or None when there is none or it is damaged (said in one line)."""
    if not paths.exists(path):
        return None
    try:
        record = jsonio.loads(paths.read_bytes(path))
    except (OSError, ValueError) as e:
        log(
            f"warning: {path} cannot be read ({jsonio.one_line(e, 200)}); choosing "
            "train.remat=auto's policy again"
        )
        return None
    valid = (
        isinstance(record, dict)
        and record.get("format") == _FORMAT
        and isinstance(record.get("policy"), str)
        and isinstance(record.get("made_for"), dict)
        and isinstance(record["made_for"].get("devices"), dict)
    )
    if not valid:
        log(
            f"warning: {path} is not a train.remat=auto record of this version; choosing the "
            "policy again"
        )
        return None
    return record


def for_run(
    workdir: str,
    config,
    mesh,
    resolve: Callable[[], Choice],
    log: Callable[[str], None],
    is_main: bool,
) -> Choice:
    """The run's policy for train.remat='auto': the workdir's recorded one when it was made for
    these devices and settings (nothing compiled), else `resolve()`'s (program.resolve_remat for
    the run's step, which compiles), recorded (by process 0).
    Logs one line either way (and one saying what changed, when the record was for others)."""
    # Heavy (jax, flax or orbax): this module is imported without them (tests/conftest.py).
    from electra_jax.model.networks import REMAT_CHOICES

    path = os.path.join(workdir, filenames.REMAT_RECORD)
    record = read_record(path, log)
    now = _made_for(config, mesh)
    if record is not None:
        changed = _changes(record["made_for"], now)
        if not changed and record["policy"] in REMAT_CHOICES:
            choice = Choice(
                record["policy"],
                f"train.remat=auto: {record['policy']!r}, as chosen for these devices and "
                f"settings before ({path}; nothing compiled to choose)",
            )
            log(choice.line)
            return choice
        what = "; ".join(changed) or f"its policy {record['policy']!r} is not one of this version"
        log(f"train.remat=auto: choosing again: {what} (since {path})")
    choice = resolve()
    log(choice.line)
    if is_main:
        trials = [
            {"policy": t.policy, "memory_per_device_bytes": t.need_bytes, "fits": t.fits}
            for t in choice.trials
        ]
        record = {
            "format": _FORMAT,
            "policy": choice.policy,
            "line": choice.line,
            "made_for": now,
            "trials": trials,
        }
        jsonio.write_json(path, record)
    return choice
