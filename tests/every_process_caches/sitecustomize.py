"""Put on PYTHONPATH by tests/test_multihost.py for the processes of a multi-process run: each
process, not only process 0, keeps the programs it compiles in the suite's compilation cache.

jax writes cache entries from process 0 alone, and on CPU a program's cache key holds the
process's view of the topology, so process 1's key is never process 0's: without this,
process 1 compiled every program of every launch anew (about 8 s of a core for the micro
step) while process 0 waited for it at the first collective. What is compiled is unchanged;
a loaded executable is the compiled one. jax is patched when it is first imported, so a
command that refuses before importing jax stays as fast as elsewhere; where jax's private
names differ, nothing is patched and the runs only compile again.
"""

import importlib.abc
import importlib.util
import sys

_MODULE = "jax._src.compiler"


def _keep_every_process_s_programs(compiler) -> None:
    from jax._src import compilation_cache, config, distributed

    write = getattr(compiler, "_cache_write", None)
    if write is None or not hasattr(compilation_cache, "put_executable_and_time"):
        return

    def cache_write(cache_key, compile_time_secs, module_name, backend, executable, callbacks):
        if distributed.global_state.process_id == 0:
            return write(cache_key, compile_time_secs, module_name, backend, executable, callbacks)
        # jax's own rules for process 0: no host callbacks, at least the minimum compile time.
        if callbacks or compile_time_secs < config.persistent_cache_min_compile_time_secs.value:
            return None
        compilation_cache.put_executable_and_time(
            cache_key, module_name, executable, backend, int(compile_time_secs)
        )
        return None

    compiler._cache_write = cache_write


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds jax._src.compiler as usual, and patches it once it has been executed."""

    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _keep_every_process_s_programs(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _AfterImport())
