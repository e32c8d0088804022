"""Guards on the third-party internals pamsim patches or relies on: each exists and takes
the parameters its user was written for, else the test names the library's version and
the pamsim file to update (an upgrade must fail here, not give wrong bits)."""
import importlib

import numpy as np
import pytest

from emu import _numba_cache as C

#: (module, attribute path, parameters or None, the pamsim file using it, what for)
INTERNALS = [
    ("torch.utils.checkpoint", "_CheckpointFrame.__init__",
     ("self", "recompute_fn", "early_stop", "unpack_error_cb", "metadata_fn"),
     "torch_bridge/mode.py", "_wrap_checkpointing wraps recompute_fn in the PAM modes"),
    ("torch.utils.checkpoint", "CheckpointFunction.forward",
     ("ctx", "run_function", "preserve_rng_state", "args"),
     "torch_bridge/mode.py", "_wrap_checkpointing wraps run_function in the PAM modes"),
    ("torch.overrides", "_get_current_function_mode_stack", (),
     "torch_bridge/mode.py", "the PAM modes active when a checkpointed block runs"),
    ("torch.nn.functional", "_get_softmax_dim", ("name", "ndim", "stacklevel"),
     "torch_bridge/mode.py, torch_bridge/modules.py", "softmax's implicit dim"),
    ("torch.nn._reduction", "legacy_get_string", ("size_average", "reduce", "emit_warning"),
     "torch_bridge/mode.py", "the losses' deprecated size_average/reduce"),
    ("torch.nn.modules.utils", "_pair", ("x",), "torch_bridge/functional.py",
     "conv2d's int-or-pair arguments"),
    ("torch.utils._python_dispatch", "TorchDispatchMode.__torch_dispatch__",
     ("self", "func", "types", "args", "kwargs"), "torch_bridge/audit.py, costs/step.py",
     "the audit and the step cost see every aten op"),
    ("torch.utils._pytree", "tree_leaves", ("tree", "is_leaf"),
     "torch_bridge/audit.py, costs/step.py", "the tensors among an op's arguments"),
    ("torch._C", "_current_autograd_node", None, "torch_bridge/audit.py",
     "which autograd node an op runs in"),
    ("torch._decomp", "decomposition_table", None, "costs/step.py",
     "ops counted through their decompositions"),
    ("torch._C", "_dispatch_get_all_op_names", None, "tests/test_torch_audit.py",
     "every aten op torch_bridge/classification.py must classify"),
    ("numba.cuda.simulator.cudadrv.devicearray", "FakeCUDAArray.__init__",
     ("self", "ary", "stream"), "torch_bridge/_tensors.py, emu/device.py",
     "a CPU tensor as a simulated device array"),
    ("numba.cuda.cudadrv.devicearray", "DeviceNDArray.__init__",
     ("self", "shape", "strides", "dtype", "stream", "gpu_data"), "emu/device.py",
     "restride: a view of a device array's memory"),
    ("numba.cuda.simulator.api", "stream", None, "emu/device.py",
     "the simulator's stream type"),
]


@pytest.mark.parametrize("module, path, params, user, why", INTERNALS,
                         ids=[f"{m}.{p}" for m, p, *_ in INTERNALS])
def test_third_party_internal(module, path, params, user, why):
    owner = importlib.import_module(module)
    *outer, name = path.split(".")
    for part in outer:
        owner = C.internal(owner, part, None, user, why)
    C.internal(owner, name, params, user, why)


@pytest.mark.parametrize("owner, name, params, why", C.NUMBA_INTERNALS,
                         ids=[f"{o.__name__}.{n}" for o, n, *_ in C.NUMBA_INTERNALS])
def test_numba_internal(owner, name, params, why):
    """emu/_numba_cache.py checks these at import too: this names each one."""
    C.internal(owner, name, params, "emu/_numba_cache.py", why)


def test_numba_instance_attributes():
    """The attributes emu/_numba_cache.py's patches read on Numba's objects (set in their
    constructors, so not visible on the classes)."""
    from numba import njit
    from numba.core import bytecode, caching
    from numba.core.registry import cpu_target
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    user = "emu/_numba_cache.py"
    index = caching.IndexDataCacheFile(cache_path="", filename_base="x", source_stamp=None)
    C.internal(index, "_index_path", None, user, "the lock file sits beside the index")
    cache = caching.FunctionCache(test_numba_instance_attributes)
    C.internal(cache, "_py_func", None, user, "njit_variant keys on its bytecode")
    C.internal(cpu_target.target_context.codegen(), "magic_tuple", (), user,
               "njit_variant keeps Numba's key of the target")
    C.internal(njit(lambda: 0), "_cache", None, user, "njit_variant replaces it")
    C.internal(FakeCUDAArray(np.zeros(2)), "_ary", None, "emu/device.py",
               "restride views the simulated array's memory")
    # the ids are drawn from the patched iterator: random, not Numba's 1, 2, 3, ...
    ids = {bytecode.FunctionIdentity.from_function(lambda: 0).unique_id for _ in range(4)}
    assert len(ids) == 4 and max(ids) >= 2 ** 32, (
        "numba no longer draws FunctionIdentity ids from _unique_ids; "
        "emu/_numba_cache.py must be updated")


def test_torch_op_attributes():
    """The attributes torch_bridge/audit.py reads on the aten ops it sees (set per
    overload object, so checked on one)."""
    import torch
    op = torch.ops.aten.mul_.Tensor
    user = "torch_bridge/audit.py"
    C.internal(op, "_overloadpacket", None, user, "an op's name and its FLOP formula")
    C.internal(op, "namespace", None, user, "ops outside aten are never classified")
    C.internal(op._schema, "arguments", None, user, "the arguments an in-place op writes")
    C.internal(op._schema.arguments[0].alias_info, "is_write", None, user,
               "the arguments an in-place op writes")


def test_dynamo_disable_mark():
    """torch_bridge/compiling.py marks its wrappers as torch.compiler.disable marks a
    function; Dynamo must still read that attribute (tests/test_torch_compile.py checks
    the behaviour)."""
    import inspect

    import torch
    import torch._dynamo.variables.functions as dynamo_functions
    assert torch.compiler.disable(lambda: 0)._torchdynamo_disable is True, (
        f"torch {torch.__version__} no longer marks disabled functions with "
        "_torchdynamo_disable; torch_bridge/compiling.py must be updated")
    assert "_torchdynamo_disable" in inspect.getsource(dynamo_functions), (
        f"torch {torch.__version__}'s Dynamo no longer reads _torchdynamo_disable; "
        "torch_bridge/compiling.py must be updated")


def test_checkpoint_patch_is_installed():
    """torch_bridge/mode.py's wrappers are in place (their behaviour: test_torch_models)."""
    from torch.utils import checkpoint

    import torch_bridge.mode  # noqa: F401  (installs the wrappers)
    assert hasattr(checkpoint._CheckpointFrame.__init__, "__wrapped__")
    assert hasattr(checkpoint.CheckpointFunction.forward, "__wrapped__")


def test_a_moved_internal_fails_with_a_clear_message():
    class Owner:
        def method(self, a):
            pass
    with pytest.raises(ImportError, match="moved .*Owner.gone; here.py must be updated: x"):
        C.internal(Owner, "gone", None, "here.py", "x")
    with pytest.raises(ImportError, match=r"changed .*Owner.method to take \('self', 'a'\)"):
        C.internal(Owner, "method", ("self", "b"), "here.py", "x")
