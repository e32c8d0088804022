"""The memory-saving activations on CUDA equal the CPU, bit for bit.

Few-bit pack/unpack, the few-bit activations (every activation, every bit width), the
PA activations (every piece count) and the inverted activations run twice from the
same inputs: on the CPU kernels and on their CUDA twins (torch_bridge/memory/_cuda.py),
and every saved code stream, output and gradient is compared by bits (NaNs by class).
Inputs are corner values (±0, subnormals, ±inf, NaN, huge) and every breakpoint,
knot and window edge with its float neighbours, plus a few random values.

Without a GPU the CUDA side runs under Numba's CUDA simulator with CPU tensors routed
through the CUDA kernels (``torch_bridge._backend.cuda_backend()``); the simulator must be
enabled before ``numba.cuda`` is imported, so a normal run defines only the outer
tests, which run this file in a subprocess with ``NUMBA_ENABLE_CUDASIM=1`` and check
from a launch log that every memory kernel ran.  ``PAMSIM_CUDA_HARDWARE=1`` runs the
same cases with CUDA tensors (``make gpu-check``).  There, the forward output of the
few-bit and inverted activations is torch's own native activation on the device (the
layers' definition; docs/semantics.md, 6: not host-independent), so it is compared
with torch's CUDA activation, and the inverted backward is compared from the CPU's y.
"""
import json
import os

import pytest

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
HARDWARE = not SIM and os.environ.get("PAMSIM_CUDA_HARDWARE") == "1"
LOG = "PAMSIM_MEMORY_LAUNCH_LOG"

if not (SIM or HARDWARE):
    def test_memory_cuda_matches_cpu(tmp_path):
        from torch_bridge.memory import _cuda
        from conftest import run_in_simulator
        log = tmp_path / "launches.jsonl"
        run_in_simulator(__file__, **{LOG: str(log)})
        launched = {json.loads(line)["kernel"] for line in log.read_text().splitlines()}
        every = {name.split("[")[0] for name, _, _ in _cuda.signatures()}
        assert every <= launched, f"not launched: {every - launched}"

    def test_mixed_devices_are_a_clear_error():
        import torch

        from torch_bridge.memory import inverter
        from torch_bridge.memory.fewbit import scale_by_code
        meta = torch.zeros(2, dtype=torch.uint8, device="meta")
        with pytest.raises(ValueError, match=r"mixed devices: grad on cpu, packed on meta"):
            scale_by_code(torch.ones(16), meta, 1, torch.ones(2))
        with pytest.raises(ValueError, match=r"mixed devices: .*y on meta"):
            inverter("gelu").scale(torch.ones(16), torch.ones(16, device="meta"),
                                   torch.zeros(2, dtype=torch.uint8))

else:
    import contextlib

    import numpy as np
    import torch

    from emu import device
    from torch_bridge._backend import cuda_backend
    from torch_bridge.memory import (ACTIVATIONS, INVERTIBLE, PA_ACTIVATIONS, activation,
                                     fewbit, fewbit_table, inverted, inverter, pa_activation,
                                     pack_bits, pa_table, unpack_bits)
    from torch_bridge.memory import _cuda
    from torch_bridge.memory.pa import PIECES

    pytestmark = pytest.mark.filterwarnings(
        "error:overflow encountered in scalar:RuntimeWarning")

    _NAMES = {id(k): name.split("[")[0] for name, k, _ in _cuda.signatures()}
    _launch = device._launch

    def _logged_launch(kernel, grid, block, stream, *args):
        if os.environ.get(LOG) and id(kernel) in _NAMES:
            with open(os.environ[LOG], "a") as f:
                f.write(json.dumps({"kernel": _NAMES[id(kernel)]}) + "\n")
        _launch(kernel, grid, block, stream, *args)

    device._launch = _logged_launch

    def on_cuda():
        """(context, tensor mover) of the CUDA side: real CUDA tensors on a GPU, CPU
        tensors through the CUDA kernels under the simulator."""
        if HARDWARE:
            return contextlib.nullcontext(), lambda t: t.cuda()
        return cuda_backend(), lambda t: t

    def same(got, want, what):
        """Bit equality, NaNs by class (a NaN anywhere the other has one)."""
        got = got.detach().cpu()
        assert got.dtype == want.dtype and got.shape == want.shape, what
        if not want.is_floating_point():
            assert torch.equal(got, want), what
            return
        ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[want.element_size()]
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan), f"{what}: NaNs differ"
        bad = (got.view(ints) != want.view(ints)) & ~nan
        assert not bad.any(), (f"{what}: {int(bad.sum())} differ, first at "
                               f"x[{int(bad.nonzero()[0])}]")

    def compare(case, what):
        """``case(move)`` on the CPU and on the CUDA kernels: equal lists of tensors."""
        torch.manual_seed(0)
        cpu = case(lambda t: t)
        ctx, move = on_cuda()
        torch.manual_seed(0)
        with ctx:
            gpu = case(move)
        assert len(cpu) == len(gpu)
        for i, (c, g) in enumerate(zip(cpu, gpu)):
            if HARDWARE:
                assert g.is_cuda, f"{what}[{i}]"
            same(g, c, f"{what}[{i}]")

    CORNERS = [0.0, -0.0, 1e-45, -1e-45, 1e-38, -1e-38, 0.5, -0.5, 1.0, -1.0, 3.0, -3.0,
               1e30, -1e30, 3e38, -3e38, float("inf"), float("-inf"), float("nan")]

    def inputs(points, dtype, n_random=13):
        """Corner values, ``points`` with both float neighbours in ``dtype``, random."""
        p = torch.tensor(sorted(points), dtype=torch.float64).to(dtype)
        inf = torch.tensor(float("inf"), dtype=dtype)
        g = torch.Generator().manual_seed(len(points))
        rnd = (torch.randn(n_random, generator=g, dtype=torch.float64) * 4).to(dtype)
        return torch.cat([torch.tensor(CORNERS, dtype=dtype), p, torch.nextafter(p, inf),
                          torch.nextafter(p, -inf), rnd])

    def saved(y):
        """The tensors the Function saved for backward (the packed codes first)."""
        return list(y.grad_fn.saved_tensors)

    # --- few-bit packing --------------------------------------------------------------

    @pytest.mark.parametrize("k", range(1, 9))
    def test_pack_unpack(k):
        def case(move):
            res = []
            for n in (1, 8, 13, 70):
                codes = move(torch.randint(0, 1 << k, (n,), dtype=torch.uint8))
                codes[0] = (1 << k) - 1                   # the widest code, and 0
                codes[-1] = 0
                packed = pack_bits(codes, k)
                res += [packed, unpack_bits(packed, k, n)]
            return res
        compare(case, f"pack/unpack k={k}")

    # --- few-bit activations ----------------------------------------------------------

    def fewbit_case(act, bits, dtype):
        a = activation(act)
        bp = fewbit_table(a, bits).breakpoints
        pts = [*bp, *(-b for b in bp)] if a.even else list(bp)

        def case(move):
            x = move(inputs(pts, dtype)).requires_grad_()
            y = fewbit(x, a, bits)
            res = saved(y)
            y.backward(move(torch.randn(x.shape, dtype=torch.float64).to(dtype)))
            res.append(x.grad)
            if HARDWARE:        # the forward is torch's native activation on the device
                same(y, a.native(x.detach()).cpu(), f"few-bit {act} native forward")
            else:
                res.append(y)
            return res
        return case

    @pytest.mark.parametrize("act", ACTIVATIONS)
    def test_fewbit(act):
        """Every activation's table, GELU (even) at every width on a GPU (1, 2, 3 and 8
        under the simulator), tanh (odd) at 1, 3 and 8 bits, the others at 2 and 8 (CI
        time: the kernels are the same for every table, ~1.5 s a width under the
        simulator)."""
        widths = {"gelu": range(1, 9) if HARDWARE else (1, 2, 3, 8),
                  "tanh": (1, 3, 8)}.get(act, (2, 8))
        for bits in widths:
            compare(fewbit_case(act, bits, torch.float32), f"few-bit {act} {bits} bits")

    @pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
    def test_fewbit_other_dtypes(dtype):
        """float64: the fused kernels in float64; bfloat16: torch's index, packed by the
        CUDA kernel, and scaled after unpacking."""
        for act, bits in (("gelu", 3), ("tanh", 5)):
            compare(fewbit_case(act, bits, dtype), f"few-bit {act} {bits} bits {dtype}")

    # --- PA activations ---------------------------------------------------------------

    @pytest.mark.parametrize("act", PA_ACTIVATIONS)
    def test_pa(act):
        """Every piece count (1 to 5 bits) in float32, the default 16 in float64."""
        for pieces, dtype in [*((p, torch.float32) for p in PIECES), (16, torch.float64)]:
            def case(move):
                x = move(inputs(pa_table(act, pieces).knots, dtype)).requires_grad_()
                y = pa_activation(x, act, pieces)
                res = [y, *saved(y)]
                y.backward(move(torch.randn(x.shape, dtype=torch.float64).to(dtype)))
                return [*res, x.grad, pa_activation(x.detach(), act, pieces)]
            compare(case, f"PA {act} {pieces} pieces {dtype}")

    # --- inverted activations ---------------------------------------------------------

    @pytest.mark.parametrize("act,dtype", [*((a, torch.float32) for a in INVERTIBLE),
                                           ("gelu", torch.float64)])
    def test_inverted(act, dtype):
        """The branch mask, the float32 window's forward, and the backward from the
        same y (every piece kind: both branches near the minimum, the left tail down to
        the constant 0, the window), then the whole autograd step."""
        inv = inverter(act)
        lo, hi = (float(v) for v in inv.window)
        pts = [inv.T, lo, hi, inv.T - 2.0, -8.0, -30.0, -60.0, 20.0,
               *np.linspace(lo, hi, 9)]
        x0 = inputs(pts, dtype)
        y0, mask0 = inv.forward(x0)
        g0 = torch.randn(x0.shape, dtype=torch.float64).to(dtype)

        def case(move):
            x = move(x0)
            y, mask = inv.forward(x)
            window = (x >= lo) & (x <= hi)
            if dtype == torch.float64:          # no window: the native forward everywhere
                window &= False
            res = [mask, torch.where(window, y, 0), inv.scale(move(g0), move(y0), move(mask0))]
            xr = x.clone().requires_grad_()
            z = inverted(xr, act)
            kept = saved(z)
            z.backward(move(g0))
            if HARDWARE:        # native forward on the device: y and the grad follow it
                same(torch.where(window, 0, y), torch.where(window, 0, inv.act.native(x)).cpu(),
                     f"inverted {act} native forward")
            else:
                res += [y, z, *kept, xr.grad]
            return res
        compare(case, f"inverted {act} {dtype}")
