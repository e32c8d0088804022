"""Every CUDA kernel compiles for real GPUs (sm_80, sm_90) on a machine without one.

``numba.cuda.compile_ptx`` lowers each kernel, with every argument type
emu/cuda_backend.py launches it with (``emu._cuda.signatures()``;
tests/test_cuda_sim.py checks that the launches stay within that list), through NVVM from the CUDA toolkit into PTX, and
``ptxas`` assembles the PTX into machine code for the same architecture, so a kernel
a real GPU would reject fails here.  The device query that compiling a
``register_jitable`` device function makes is answered by a stub.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from emu import _cuda
from torch_bridge.memory import _cuda as memory_cuda

ARCHS = [(8, 0), (9, 0)]
SIGNATURES = {name: (kernel, types) for name, kernel, types in _cuda.signatures()}
#: the memory-saving activations' kernels (torch_bridge/memory/_cuda.py)
MEMORY = {name: (kernel, types) for name, kernel, types in memory_cuda.signatures()}


def _ptxas():
    cand = [shutil.which("ptxas")] + [Path(p) / "bin" / "ptxas" for p in (
        os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda") if p]
    return next((str(p) for p in cand if p and Path(p).is_file()), None)


@pytest.fixture(scope="module")
def compile_for():
    """compile_ptx with the current-device query stubbed to the target architecture."""
    import numba.cuda.dispatcher as dispatcher
    from numba.cuda import compile_ptx

    class Device:
        compute_capability = None

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dispatcher, "get_current_device", lambda: Device)

        def compile_(kernel, types, cc):
            Device.compute_capability = cc
            ptx, _ = compile_ptx(kernel.py_func, types, cc=cc)
            return ptx
        yield compile_


@pytest.mark.parametrize("cc", ARCHS, ids=lambda cc: f"sm_{cc[0]}{cc[1]}")
@pytest.mark.parametrize("name", [*SIGNATURES, *MEMORY])
def test_kernel_compiles_and_assembles(name, cc, compile_for, tmp_path):
    kernel, types = {**SIGNATURES, **MEMORY}[name]
    ptx = compile_for(kernel, types, cc)
    arch = f"sm_{cc[0]}{cc[1]}"
    assert f".target {arch}" in ptx and ".entry" in ptx
    if name in MEMORY:      # every product rounds on its own, as on the CPU (_scalar.mul)
        assert "fma." not in ptx, f"{name}: NVVM contracted a multiply-add"
    ptxas = _ptxas()
    if ptxas is None:
        pytest.skip("ptxas not found (CUDA_HOME, /usr/local/cuda): PTX generated, not assembled")
    src = tmp_path / "k.ptx"
    src.write_text(ptx)
    proc = subprocess.run([ptxas, f"-arch={arch}", "-v", "-o", str(tmp_path / "k.cubin"),
                           str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    info = proc.stderr
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", info)]
    assert spills and not any(spills), f"{name} spills registers on {arch}:\n{info}"
    if name == "matmul_f32acc":
        # the R x R float32 accumulators and operands stay in registers
        assert re.search(r"\b0 bytes stack frame", info), info


@pytest.mark.parametrize("module,sigs", [(_cuda, SIGNATURES), (memory_cuda, MEMORY)],
                         ids=["emu", "memory"])
def test_signatures_cover_every_kernel(module, sigs):
    from numba.cuda.dispatcher import CUDADispatcher
    values = list(vars(module).values())
    values += [k for v in values if isinstance(v, dict) for k in v.values()]   # GRAD_* tables
    kernels = {id(v) for v in values if isinstance(v, CUDADispatcher)}
    assert kernels == {id(k) for k, _ in sigs.values()}
