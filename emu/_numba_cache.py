"""Numba's on-disk kernel cache, made safe for pamsim: stale dependencies and
concurrent processes.

Numba keys a cached kernel on the timestamp of the file that defines it, not of
the files whose ``register_jitable`` functions it inlines: editing emu/_scalar.py
would otherwise leave stale machine code in place.  Every module with cached
kernels calls :func:`drop_stale` at import time, before its kernels are used.

Numba's cache index is not safe across processes: two processes that compile
different specialisations of one function at once (``pytest -n 2`` on a cold cache,
a factory's kernel variants) can both read the same index, pick the same data-file
number and save, leaving an index entry that points at the *other* specialisation's
machine code — wrong bits, not an error.  Importing this module therefore serialises
each index's read-pick-write (:func:`_locked`, an ``flock`` on a file beside the
index).

Numba names each compiled function's symbol by its qualified name and a per-process
counter, so two processes that compile different closures of one factory (a kernel
variant's inner ``register_jitable`` helpers) give them the same symbol; a later
process that loads both from the cache links one body for both, and the other variant
silently runs it (numba/numba#10486).  Importing this module therefore draws those ids
at random (:class:`_RandomIds`), so that no two processes share one.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import secrets
import warnings
from pathlib import Path

from numba.core import bytecode, caching


def _locked(method, mode):
    """``method`` of Numba's IndexDataCacheFile under an flock (``mode``) of the
    index's lock file; without a writable cache directory, unlocked as before."""
    @functools.wraps(method)
    def wrapper(self, *args):
        try:
            lock = open(self._index_path + ".lock", "a")
        except OSError:
            return method(self, *args)
        with lock:
            fcntl.flock(lock, mode)
            return method(self, *args)      # closing the file releases the lock
    return wrapper


class _RandomIds:
    """An endless iterator of random 64-bit ids, for Numba's FunctionIdentity in place of
    its counter from 1 (module docstring)."""

    def __iter__(self):
        return self

    def __next__(self) -> int:
        return secrets.randbits(64)


if not isinstance(bytecode.FunctionIdentity._unique_ids, _RandomIds):
    bytecode.FunctionIdentity._unique_ids = _RandomIds()

if not getattr(caching.IndexDataCacheFile.save, "_pamsim_locked", False):
    caching.IndexDataCacheFile.save = _locked(caching.IndexDataCacheFile.save, fcntl.LOCK_EX)
    caching.IndexDataCacheFile.load = _locked(caching.IndexDataCacheFile.load, fcntl.LOCK_SH)
    caching.IndexDataCacheFile.save._pamsim_locked = True


def drop_stale(probe, module_file: str, *dependencies: str, config: str = "") -> None:
    """Delete ``module_file``'s cached kernels if it, a dependency, ``config`` or this
    module (how the cache is kept) changed.

    ``probe`` is any ``@njit(cache=True)`` dispatcher defined in ``module_file``;
    it tells where Numba keeps that module's cache.  ``config`` names import-time
    choices that kernels compile in as constants (Numba's own key ignores them).
    """
    files = [Path(module_file), *map(Path, dependencies), Path(__file__)]
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)
                            + config.encode()).hexdigest()[:20]
    try:
        cache_dir = Path(probe._cache._cache_path)
    except AttributeError:          # Numba internals moved: better loud than stale
        warnings.warn("pamsim cannot locate Numba's cache directory; if emu kernels "
                      "misbehave after an upgrade, delete emu/__pycache__", stacklevel=2)
        return
    stem = Path(module_file).stem
    stamp = cache_dir / f"{stem}.dependency-digest"
    try:
        if stamp.read_text() == digest:
            return
    except OSError:
        pass
    for f in cache_dir.glob(f"{stem}.*.nb[ci]"):
        f.unlink(missing_ok=True)
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        stamp.write_text(digest)
    except OSError:
        pass


def njit_variant(variant: str, **options):
    """``njit(cache=True, **options)`` for a kernel that a factory builds once per
    ``variant`` (a string naming every factory argument the kernel compiles in).

    Numba keys a closure's cache entry on the pickled contents of its cells; cells that
    hold other jitted functions pickle with a per-process id, so every process missed
    the cache, compiled the kernel again (tens of seconds for the matmuls) and added an
    entry to the index.  This keys it on the bytecode and ``variant`` instead;
    :func:`drop_stale` still drops it when the module or a dependency changes.
    """
    from numba import njit
    from numba.core.caching import FunctionCache

    class VariantCache(FunctionCache):
        def _index_key(self, sig, codegen):
            code = hashlib.sha256(self._py_func.__code__.co_code).hexdigest()
            return sig, codegen.magic_tuple(), (code, variant)

    def wrap(py_func):
        kernel = njit(**options)(py_func)
        kernel._cache = VariantCache(py_func)
        return kernel
    return wrap
