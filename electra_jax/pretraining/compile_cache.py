"""jax's persistent compilation cache for a run (`compile.cache_dir`), and its hits.

A restart (a preemption's, a kill's, a longer num_steps) compiles the same step program as the
start before it: with the cache, jax loads the executable instead (seconds instead of minutes
for a large model). The key is jax's: the program's text, the devices, jax's and XLA's versions
and flags, so a changed config (another model, batch or schedule) misses and compiles, and a
loaded executable is the compiled one (the same numbers).
"""

from __future__ import annotations

import os

import jax

from electra_jax.store import filenames, paths

OFF = "off"
DEFAULT_FOLDER = filenames.COMPILE_CACHE_DIR
_HIT = "/jax/compilation_cache/cache_hits"
_hits = 0
_listening = False


def _count(event: str, **kwargs) -> None:
    global _hits
    if event == _HIT:
        _hits += 1


def hits() -> int:
    """Programs loaded from the persistent cache in this process so far (after `configure`)."""
    return _hits


def folder(cache_dir: str, workdir: str) -> str | None:
    """The cache's folder for compile.cache_dir = `cache_dir`: itself; '' is
    $JAX_COMPILATION_CACHE_DIR where set (the launchers set it beside the workdir, shared by
    runs), else WORKDIR/compile_cache; None for 'off'."""
    if cache_dir.strip().lower() == OFF:  # a special word in any case: OFF made a folder OFF
        return None
    if cache_dir:
        return paths.normal(cache_dir)  # GS://b/c is gs://b/c, the form jax's etils reads
    env = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    return env or paths.join(paths.absolute(workdir), DEFAULT_FOLDER)


def configure(cache_dir: str, workdir: str) -> str | None:
    """Points jax's persistent cache at `folder(cache_dir, workdir)` (or turns it off) before the
    run compiles; returns the folder. gs:// folders are written by jax itself (etils' paths)."""
    global _listening
    target = folder(cache_dir, workdir)
    if not _listening:
        jax.monitoring.register_event_listener(_count)
        _listening = True
    if target is None:
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    paths.makedirs(target)  # jax writes a gs:// folder itself
    if jax.config.jax_compilation_cache_dir != target:
        jax.config.update("jax_compilation_cache_dir", target)
        _reset()
    jax.config.update("jax_enable_compilation_cache", True)
    return target


def _reset() -> None:
    """jax opens its cache once per process, at the first compile: a process that compiled
    before (a notebook, a test) would go on writing to the previous folder. jax has no public
    way to reopen it; without the private one the previous folder stays in use."""
    try:
        # jax's private module: only where this is asked.
        from jax._src import compilation_cache
    except ImportError:  # pragma: no cover - a jax without the module
        return
    reset = getattr(compilation_cache, "reset_cache", None)
    if reset is not None:
        reset()
