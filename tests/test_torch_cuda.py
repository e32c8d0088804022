"""torch_bridge through emu's CUDA backend equals its CPU backend, bit for bit.

Every case computes the same thing twice from the same seed: once with CPU tensors
on the CPU backend, once on the CUDA backend, and compares every output, gradient
and optimizer state by bits (NaNs by class).  Without a GPU the CUDA side runs under
Numba's CUDA simulator with CPU tensors routed through the CUDA kernels
(``torch_bridge._backend.cuda_backend()``); the simulator has to be enabled before
``numba.cuda`` is imported, so a normal pytest run defines only
``test_torch_cuda_backend_matches_cpu``, which runs this file in a subprocess with
``NUMBA_ENABLE_CUDASIM=1`` (as tests/test_cuda_sim.py does).  On a machine with a
GPU, ``PAMSIM_CUDA_HARDWARE=1 pytest tests/test_torch_cuda.py`` runs the same cases
with CUDA tensors (``make gpu-check``).  Shapes are small: the simulator runs every
GPU thread as a Python thread.
"""
import contextlib
import os

import pytest

SIM = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
HARDWARE = not SIM and os.environ.get("PAMSIM_CUDA_HARDWARE") == "1"

if not (SIM or HARDWARE):
    def test_torch_cuda_backend_matches_cpu():
        from conftest import run_in_simulator
        run_in_simulator(__file__)

    def test_mixed_devices_are_a_clear_error():
        import torch

        from torch_bridge._tensors import same_device
        with pytest.raises(ValueError, match=r"mixed devices: a on cpu, b on meta"):
            same_device(a=torch.ones(2), b=torch.ones(2, device="meta"), c=1.0)
        same_device(a=torch.ones(2), b=torch.ones(3), c=1.0)

else:
    import torch
    from torch import nn

    import emu
    import torch_bridge as tb
    from conftest import assert_bits_equal
    from torch_bridge._backend import cuda_backend

    pytestmark = pytest.mark.filterwarnings(
        "error:overflow encountered in scalar:RuntimeWarning")

    def on_cuda():
        """(context, tensor mover) of the CUDA side: real CUDA tensors on a GPU, CPU
        tensors through the CUDA kernels under the simulator."""
        if HARDWARE:
            return contextlib.nullcontext(), lambda t: t.cuda()
        return cuda_backend(), lambda t: t

    def twice(case):
        """``case(move)`` on the CPU backend and on the CUDA one (same seed): the two
        lists of tensors it returns, both on the CPU."""
        out = []
        for cuda in (False, True):
            torch.manual_seed(0)
            ctx, move = on_cuda() if cuda else (contextlib.nullcontext(), lambda t: t)
            with ctx:
                res = case(move)
            if cuda and HARDWARE:
                assert all(t.is_cuda for t in res if t is not None)
            out.append([None if t is None else t.detach().cpu() for t in res])
        return out

    def check(case, what):
        cpu, gpu = twice(case)
        assert len(cpu) == len(gpu)
        for i, (c, g) in enumerate(zip(cpu, gpu)):
            assert (c is None) == (g is None), f"{what}[{i}]"
            if c is not None:
                assert c.shape == g.shape and c.dtype == g.dtype, f"{what}[{i}]"
                assert_bits_equal(g.float().numpy(), c.float().numpy(), what=f"{what}[{i}]")

    def leaf(move, *shape, scale=2.0):
        return move(torch.randn(*shape) * scale).requires_grad_()

    ELEMENTWISE = [op for op in emu.registry.ops(differentiable=True)]

    @pytest.mark.parametrize("kind", ["exact", "approx"])
    @pytest.mark.parametrize("fmt", ["float32", "bf16"])
    def test_elementwise_forward_backward(fmt, kind):
        def case(move):
            res = []
            for op in ELEMENTWISE:
                f = getattr(tb, op.name)
                if op.arity == 2:
                    a, b = leaf(move, 3, 4), leaf(move, 4)        # broadcast b
                    y = f(a, b, fmt, backward=kind)
                    y.backward(move(torch.randn(3, 4)))
                    res += [y, a.grad, b.grad, f(a, 0.75, fmt)]
                else:
                    x = leaf(move, 3, 4)
                    y = f(x, fmt, backward=kind)
                    y.backward(move(torch.randn(3, 4)))
                    res += [y, x.grad]
            return res
        check(case, f"elementwise {fmt} {kind}")

    @pytest.mark.parametrize("kind", ["exact", "approx"])
    def test_elementwise_products_of_another_multiplier(kind):
        """pam_mul's products by L-Mul and by a corrected PAM (emu.mul, emu.grad.mul on the
        device), forward and backward."""
        def case(move):
            res = []
            for mul in ("lmul", "cpam2-unbiased"):
                a, b = leaf(move, 3, 4), leaf(move, 4)
                y = tb.pam_mul(a, b, "bf16", backward=kind, mul=mul)
                y.backward(move(torch.randn(3, 4)))
                res += [y, a.grad, b.grad]
            return res
        check(case, f"other multipliers {kind}")

    @pytest.mark.parametrize("fmt,acc,kind,rounding", [
        ("float32", "float32", "approx", "nearest_even"),
        ("bf16", "float32", "exact", "nearest_even"),
        # (the narrow exact gradient fold on the device: test_cuda_sim.py's grad group)
        ("e4m3", "bf16", "approx", "stochastic"),
    ])
    def test_matmul_forward_backward(fmt, acc, kind, rounding):
        def case(move):
            a, b = leaf(move, 2, 5, 6), leaf(move, 6, 3)          # batched, broadcast weight
            y = tb.pam_matmul(a, b, fmt, acc=acc, backward=kind, rounding=rounding)
            y.backward(move(torch.randn(2, 5, 3)))
            x, w = leaf(move, 4, 6), leaf(move, 3, 6)
            z = tb.pam_linear(x, w, move(torch.randn(3)), fmt, backward=kind)
            z.sum().backward()
            return [y, a.grad, b.grad, z, x.grad, w.grad]
        check(case, f"matmul {fmt} {acc} {kind} {rounding}")

    @pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp4/16"])
    def test_matmul_mx(fmt):
        """An MX config: operands and dY rounded in blocks by emu.mx's CUDA kernels."""
        def case(move):
            a, b = leaf(move, 2, 5, 40), leaf(move, 40, 3)
            y = tb.pam_matmul(a, b, fmt)
            y.backward(move(torch.randn(2, 5, 3)))
            return [y, a.grad, b.grad]
        check(case, f"matmul {fmt}")

    @pytest.mark.parametrize("kind", ["exact", "approx"])
    def test_composites(kind):
        kw = dict(fmt="bf16", backward=kind)

        def case(move):
            x = leaf(move, 3, 5)
            s = tb.pa_softmax(x, -1, **kw)
            s.backward(move(torch.randn(3, 5)))
            h = leaf(move, 2, 3, 6)
            g, b = leaf(move, 6), leaf(move, 6)
            ln = tb.pa_layer_norm(h, 6, g, b, **kw)
            ln.sum().backward()
            z = leaf(move, 4, 5)
            t = move(torch.tensor([0, 3, -100, 1]))
            w = move(torch.rand(5) + 0.5)
            ce = tb.pa_cross_entropy(z, t, w, label_smoothing=0.1, **kw)
            ce.backward()
            cfg = tb.PAMConfig("bf16", ops={"matmul", "softmax"}, backward=kind)
            q, k, v = (leaf(move, 1, 2, 3, 4) for _ in range(3))
            att = tb.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                             config=cfg)
            att.sum().backward()
            return [s, x.grad, ln, h.grad, g.grad, b.grad, ce, z.grad, att, q.grad, k.grad,
                    v.grad]
        check(case, f"composites {kind}")

    # the exact kind (CI time: the approximate one's graphs are the CPU tests' and
    # test_composites' kernels)
    @pytest.mark.parametrize("kind", ["exact"])
    def test_fused_composites_and_recurrent_layers(kind):
        """The CPU side runs the fused kernels (torch_bridge/_compose.py) (activations, log_softmax, RMS
        norm, GRU/LSTM directions), the CUDA side their graphs of emu CUDA kernels."""
        from torch_bridge import elementwise as PE, losses as PL
        kw = dict(fmt="bf16", backward=kind)
        cfg = tb.PAMConfig("bf16", backward=kind)

        def case(move):
            x = leaf(move, 2, 5)
            ys = [PE.pa_gelu(x, **kw), PE.pa_gelu(x, "tanh", **kw), PE.pa_silu(x, **kw),
                  PE.pa_sigmoid(x, **kw), PE.pa_tanh(x, **kw), PE.pa_softplus(x, **kw),
                  PL.pa_log_softmax(x, -1, **kw), PE.pa_rms_norm(x, 5, leaf(move, 5), **kw)]
            sum(y.sum() for y in ys).backward()
            res = ys + [x.grad]
            for cell in (nn.GRU, nn.LSTM):
                rnn = cell(3, 2).to(move(torch.zeros(0)).device)
                s = leaf(move, 2, 1, 3)
                with tb.pam_mode(cfg):
                    out = rnn(s)
                out[0].sum().backward()
                res += [out[0], s.grad, *(p.grad for p in rnn.parameters())]
            return res
        check(case, f"fused composites {kind}")

    @pytest.mark.parametrize("name,hyper", [
        ("adamw", dict(lr=0.1, weight_decay=0.1)),
        ("sgd", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ])
    def test_optimizers(name, hyper):
        cfg = tb.PAMConfig("bf16", ops={"optimizer"}, rounding="stochastic")

        def case(move):
            p = nn.Parameter(move(torch.randn(3, 4)))
            opt = tb.make_optimizer(name, [p], cfg, **hyper)
            for _ in range(2):
                p.grad = move(torch.randn(3, 4))
                opt.step()
            return [p, *(v for v in opt.state[p].values() if torch.is_tensor(v) and v.dim())]
        check(case, f"optimizer {name}")

    def test_pam_mode_small_transformer():
        cfg = tb.PAMConfig("bf16", backward="exact")

        def case(move):
            layer = nn.TransformerEncoderLayer(8, 2, 12, dropout=0.0, batch_first=True)
            layer = layer.to(move(torch.zeros(0)).device)
            x = leaf(move, 2, 3, 8, scale=1.0)
            with tb.pam_mode(cfg):
                y = layer(x)
                y.square().sum().backward()
            return [y, x.grad, *(p.grad for p in layer.parameters())]
        check(case, "pam_mode transformer")

    def test_training_step():
        """One step of the digits MLP shape (scaled down): converted model, PA loss,
        PAAdamW, every op group on."""
        cfg = tb.PAMConfig("bf16", rounding="stochastic")

        def case(move):
            model = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 4))
            model = tb.convert(model, cfg).to(move(torch.zeros(0)).device)
            opt = tb.PAAdamW(model.parameters(), lr=0.01, config=cfg)
            x, t = move(torch.randn(5, 8)), move(torch.randint(0, 4, (5,)))
            loss = tb.functional.cross_entropy(model(x), t, config=cfg)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return [loss, *model.parameters()]
        check(case, "training step")
