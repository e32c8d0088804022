"""Numba's on-disk kernel cache, made safe for pamsim: stale dependencies and
concurrent processes.

Numba keys a cached kernel on the timestamp of the file that defines it, not of
the files whose ``register_jitable`` functions it inlines: editing emu/_scalar.py
would otherwise leave stale machine code in place.  Every module with cached
kernels calls :func:`drop_stale` at import time, before its kernels are used; it
hashes every pamsim module the caller imports, directly or not (:func:`dependencies`).

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

import ast
import fcntl
import functools
import hashlib
import inspect
import secrets
import sys
import types
from pathlib import Path

from numba.core import bytecode, caching


def internal(owner, name: str, params: tuple[str, ...] | None, user: str, why: str):
    """``owner.name``, a third party's internal that pamsim's ``user`` (a file) patches or
    relies on, checked to exist and, when ``params`` is given, to take exactly those
    parameters (the ones ``user`` was written for).  Raises ImportError naming the
    library's version and what to update: an upgrade that moves it fails loudly, not with
    wrong bits (tests/test_patches.py checks every such internal)."""
    kind = owner if inspect.isclass(owner) or inspect.ismodule(owner) else type(owner)
    module = kind.__name__ if inspect.ismodule(kind) else kind.__module__
    lib = "numba_cuda" if module.startswith("numba.cuda") else module.partition(".")[0]
    where = f"{lib} {getattr(sys.modules.get(lib), '__version__', '?')}"
    what = f"{getattr(kind, '__qualname__', module)}.{name}"
    try:
        attr = getattr(owner, name)
    except AttributeError:
        raise ImportError(f"{where} moved {what}; {user} must be updated: {why}") from None
    if params is not None:
        got = tuple(inspect.signature(attr).parameters)
        if got != params:
            raise ImportError(f"{where} changed {what} to take {got}, not {params}; "
                              f"{user} must be updated: {why}")
    return attr


#: the Numba internals this module patches or relies on: (owner, name, parameters, why)
NUMBA_INTERNALS = (
    (bytecode.FunctionIdentity, "_unique_ids", None,
     "replaced by random ids so that no two processes share a symbol"),
    (bytecode.FunctionIdentity, "from_function", ("pyfunc",),
     "draws the ids from _unique_ids"),
    (caching.IndexDataCacheFile, "__init__",
     ("self", "cache_path", "filename_base", "source_stamp"), "sets _index_path"),
    (caching.IndexDataCacheFile, "save", ("self", "key", "data"),
     "wrapped in a lock of _index_path"),
    (caching.IndexDataCacheFile, "load", ("self", "key"), "wrapped in a lock of _index_path"),
    (caching.FunctionCache, "__init__", ("self", "py_func"),
     "builds the cache of a function, to learn its directory and for njit_variant"),
    (caching.FunctionCache, "cache_path", None, "the directory drop_stale cleans"),
    (caching.FunctionCache, "_index_key", ("self", "sig", "codegen"),
     "overridden by njit_variant (with self._py_func and codegen.magic_tuple())"),
)
for _owner, _name, _params, _why in NUMBA_INTERNALS:
    internal(_owner, _name, _params, "emu/_numba_cache.py", _why)


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


#: the directory holding the packages whose modules a kernel may inline (emu's parent)
_ROOT = Path(__file__).resolve().parent.parent
#: the packages a kernel module can import functions from to inline (tests/test_layering.py:
#: only these two define kernels, and neither imports a higher package)
_PACKAGES = ("emu", "torch_bridge")


def _module_file(parts: tuple[str, ...]) -> Path | None:
    """The source file of the pamsim module named by ``parts``; None for anything else."""
    if not parts or parts[0] not in _PACKAGES:
        return None
    base = _ROOT.joinpath(*parts)
    for f in (base.with_suffix(".py"), base / "__init__.py"):
        if f.is_file():
            return f
    return None


@functools.lru_cache(maxsize=None)
def _imports(path: Path) -> frozenset[Path]:
    """The files of the pamsim modules that ``path``'s source imports, anywhere in it
    (inside functions too)."""
    inside = path.is_relative_to(_ROOT)     # outside, relative imports reach no pamsim module
    package = path.relative_to(_ROOT).parts[:-1] if inside else None
    found = []
    for node in ast.walk(ast.parse(path.read_bytes(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:            # ``import a.b`` binds a and loads a.b
                parts = tuple(alias.name.split("."))
                found += [parts[:i] for i in range(1, len(parts) + 1)]
        elif isinstance(node, ast.ImportFrom) and (inside or not node.level):
            base = package[:len(package) + 1 - node.level] if node.level else ()
            base += tuple(node.module.split(".")) if node.module else ()
            subs = [base + (alias.name,) for alias in node.names]
            # ``from pkg import name`` reads pkg/__init__ unless every name is a submodule
            found += subs if all(map(_module_file, subs)) else [base, *subs]
    return frozenset(f for f in map(_module_file, found) if f is not None)


def dependencies(module_file: str) -> list[Path]:
    """``module_file`` and every pamsim module it imports, directly or through others:
    every file whose ``register_jitable`` functions its kernels can inline, sorted."""
    seen, todo = set(), [Path(module_file).resolve()]
    while todo:
        f = todo.pop()
        if f not in seen:
            seen.add(f)
            todo.extend(_imports(f))
    return sorted(seen)


def cache_dir(module_file: str) -> Path:
    """Where Numba caches the kernels of ``module_file`` (the same for all its functions:
    Numba's locators use only the file), from the cache of a stand-in function of it."""
    stand_in = types.FunctionType(compile("0", module_file, "eval"), {})
    return Path(caching.FunctionCache(stand_in).cache_path)


def dependency_digest(module_file: str, config: str = "") -> str:
    """A digest of ``module_file``, every module it imports (:func:`dependencies`) and
    ``config``: what its kernels' machine code depends on."""
    return hashlib.sha256(b"".join(f.read_bytes() for f in dependencies(module_file))
                          + config.encode()).hexdigest()[:20]


def drop_stale(module_file: str, config: str = "") -> None:
    """Delete ``module_file``'s cached kernels if it, a module it imports (directly or
    not, :func:`dependencies`: this one among them), or ``config`` changed.

    Call it as ``drop_stale(__file__)`` at import, before the module's kernels run.
    ``config`` names import-time choices that kernels compile in as constants (Numba's
    own key ignores them).
    """
    digest = dependency_digest(module_file, config)
    cache = cache_dir(module_file)
    stem = Path(module_file).stem
    stamp = cache / f"{stem}.dependency-digest"
    try:
        if stamp.read_text() == digest:
            return
    except OSError:
        pass
    for f in cache.glob(f"{stem}.*.nb[ci]"):
        f.unlink(missing_ok=True)
    try:
        cache.mkdir(parents=True, exist_ok=True)
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
        internal(kernel, "_cache", None, "emu/_numba_cache.py", "njit_variant replaces it")
        kernel._cache = VariantCache(py_func)
        return kernel
    return wrap
