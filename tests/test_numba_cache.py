"""emu/_numba_cache.py: Numba's cache is safe across concurrent processes: its index, and
the symbols of closures compiled in different processes."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: a child process: compile three specialisations of one cached function (a distinct
#: set per child), with Numba's index write slowed down so that, unlocked, children
#: read the same index and pick the same data file
_CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    from numba.core import caching
    if sys.argv[2] == "locked":
        import emu._numba_cache  # noqa: F401  (installs the lock)
    save_index = caching.IndexDataCacheFile._save_index
    def slow(self, overloads):
        time.sleep(0.3)
        save_index(self, overloads)
    caching.IndexDataCacheFile._save_index = slow
    import kmod
    types = [np.int8, np.int16, np.int32, np.int64, np.float32, np.float64, np.uint8,
             np.uint16, np.uint32]
    for t in types[3 * int(sys.argv[1]):][:3]:
        kmod.f(t(3))
""")

_CHECK = textwrap.dedent("""
    import numpy as np, kmod
    types = [np.int8, np.int16, np.int32, np.int64, np.float32, np.float64, np.uint8,
             np.uint16, np.uint32]
    got = [kmod.f(t(3)) for t in types]
    hits = kmod.f.stats.cache_hits
    print(sum(r != 7 for r in got), sum(hits.values()))
""")


def _env(tmp_path):
    """A child's environment: a Numba cache and modules under ``tmp_path``, and pamsim."""
    return dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
                PYTHONPATH=os.pathsep.join([str(tmp_path), str(Path(__file__).parent.parent)]))


def _run(tmp_path, mode):
    (tmp_path / "kmod.py").write_text("from numba import njit\n\n@njit(cache=True)\n"
                                      "def f(x):\n    return x * 2 + 1\n")
    env = _env(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(i), mode], env=env)
             for i in range(3)]
    assert all(p.wait() == 0 for p in procs)
    out = subprocess.run([sys.executable, "-c", _CHECK], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[0]), int(out[1])


def test_concurrent_compiles_keep_the_index_right(tmp_path):
    """Three processes compile nine specialisations at once; a fresh process then loads
    every one from the cache, each the right machine code."""
    wrong, hits = _run(tmp_path, "locked")
    assert (wrong, hits) == (0, 9)


@pytest.mark.slow
def test_unlocked_index_loses_entries(tmp_path):
    """Without the lock the same run loses or crosses index entries (what the lock is
    for): fewer than nine cache hits, or wrong results."""
    wrong, hits = _run(tmp_path, "unlocked")
    assert wrong > 0 or hits < 9


#: a factory's kernel variants, each with an inner helper closure (as emu's kernels)
_FACTORY = textwrap.dedent("""
    import numpy as np
    from numba.extending import register_jitable
    import emu._numba_cache
    from emu._numba_cache import njit_variant

    def make(c):
        @register_jitable
        def inner(a, out):
            for i in range(a.size):
                v = a[i]
                for _ in range(3):
                    v = (v * c + 1) % 1000003
                    if v & 1:
                        v = v ^ (i * c)
                out[i] = v

        @njit_variant(f"c={c}")
        def kernel(a):
            out = np.empty_like(a)
            inner(a, out)
            inner(out, a)
            inner(a, out)
            return out
        return kernel
""")


def test_variants_compiled_in_different_processes_keep_their_code(tmp_path):
    """Two processes each compile one variant of a factory's kernel (the same sequence of
    compilations, so Numba's counter would give their inner helpers one symbol); a third
    loads both from the cache, and each runs its own code (numba/numba#10486: the second
    ran the first's)."""
    (tmp_path / "kfac.py").write_text(_FACTORY)
    env = _env(tmp_path)
    run = "import sys, numpy as np, kfac; print(kfac.make(int(sys.argv[1]))(np.arange(5)).sum())"
    fresh = [int(subprocess.run([sys.executable, "-c", run, c], env=env, check=True,
                                capture_output=True, text=True).stdout) for c in ("2", "3")]
    assert fresh[0] != fresh[1]
    both = ("import numpy as np, kfac\nk2, k3 = kfac.make(2), kfac.make(3)\n"
            "print(k2(np.arange(5)).sum(), k3(np.arange(5)).sum(),\n"
            "      sum(k2.stats.cache_hits.values()) + sum(k3.stats.cache_hits.values()))")
    out = subprocess.run([sys.executable, "-c", both], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    assert [int(v) for v in out] == [*fresh, 2]


def test_dependencies_are_computed():
    """drop_stale hashes every pamsim module a kernel module imports, directly or not:
    the files whose register_jitable functions it inlines, and the cache's own module."""
    from emu import _numba_cache as C
    root = Path(__file__).parent.parent

    def deps(module):
        return {str(f.relative_to(root)) for f in C.dependencies(str(root / module))}
    assert {"emu/_kernels_acc.py", "emu/_scalar.py", "emu/_tiles.py", "emu/_kernels.py",
            "emu/_numba_cache.py", "emu/registry.py"} <= deps("emu/_kernels_acc.py")
    assert {"torch_bridge/memory/_kernels.py", "torch_bridge/memory/_scalar.py",
            "emu/_numba_cache.py", "emu/_scalar.py"} <= deps("torch_bridge/memory/_kernels.py")
    assert {"emu/_kernels_grad.py", "emu/_kernels_reduce.py", "emu/_scalar_grad.py",
            "torch_bridge/_nodes.py"} <= deps(
        "torch_bridge/_compose.py")


#: a package ``emu`` in a child's directory: a cached kernel module that inlines, through
#: a module between, a register_jitable function of a third module
_PACKAGE = {
    "__init__.py": "",
    "_dep.py": "from numba.extending import register_jitable\n\n@register_jitable\n"
               "def f():\n    return 1\n",
    "_mid.py": "from numba.extending import register_jitable\nfrom ._dep import f\n\n"
               "@register_jitable\ndef h():\n    return f() + 10\n",
    "kmod.py": "from numba import njit\nfrom . import _mid\nfrom ._numba_cache import drop_stale\n"
               "\ndrop_stale(__file__)\n\n@njit(cache=True)\ndef g():\n    return _mid.h()\n",
}


def test_editing_an_inlined_dependency_drops_the_cache(tmp_path):
    """A kernel loads from the cache while nothing changed, and is compiled afresh once a
    module it inlines through another is edited (Numba alone would serve the old code)."""
    package = tmp_path / "emu"
    package.mkdir()
    for name, text in _PACKAGE.items():
        (package / name).write_text(text)
    (package / "_numba_cache.py").write_bytes(
        (Path(__file__).parent.parent / "emu" / "_numba_cache.py").read_bytes())
    env = _env(tmp_path)
    run = "from emu import kmod; print(kmod.g(), sum(kmod.g.stats.cache_hits.values()))"

    def child():
        done = subprocess.run([sys.executable, "-c", run], env=env, cwd=tmp_path,
                              capture_output=True, text=True)     # its emu, not ours
        assert done.returncode == 0, done.stderr
        return done.stdout.split()
    assert child() == ["11", "0"]
    assert child() == ["11", "1"]
    (package / "_dep.py").write_text(_PACKAGE["_dep.py"].replace("return 1", "return 2"))
    assert child() == ["12", "0"]
