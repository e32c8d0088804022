"""GPU kernels: PAM matmul on CUDA vs torch.matmul fp32 (TF32 off) and vs the CPU kernel,
and a torch_bridge training step on CUDA tensors vs the native CUDA step.

Needs a CUDA device.  Without one (or under Numba's CUDA simulator, which is not a
GPU) the group prints one ``no CUDA device: <reason>`` line and yields no rows.
Operands are torch CUDA tensors when torch has CUDA, else Numba device arrays (then
only the CPU-kernel baseline is measured).  Every timed call ends with a device
synchronisation, so the times are wall times of finished work.
"""
from __future__ import annotations

import numpy as np

import emu
from sim.bench import Row, best_of, case, threads


def no_device_reason() -> str | None:
    """Why the CUDA cases cannot run here, or None when a CUDA device is usable."""
    try:
        from numba import config, cuda
    except ImportError as exc:
        return f"numba-cuda is not importable ({exc})"
    if config.ENABLE_CUDASIM:
        return "NUMBA_ENABLE_CUDASIM=1 selects Numba's CUDA simulator, which is not a GPU"
    if cuda.is_available():
        return None
    err = cuda.cuda_error()
    return " ".join(str(err).split()) if err else "numba.cuda.is_available() is False"


def _torch_cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


@case("cuda")
def cuda_cases(quick: bool) -> list[Row]:
    reason = no_device_reason()
    if reason:
        print(f"no CUDA device: {reason.rstrip('.')} (the cuda case group has no rows)")
        return []
    from numba import cuda
    torch = _torch_cuda()
    rng = np.random.default_rng(0)
    n = 1024 if quick else 4096          # vs torch
    nc = 256 if quick else 1024          # vs the CPU kernel (seconds on a CPU)
    rep = 3 if quick else 5
    rows = []

    if torch is None:
        print("cuda bench: torch has no CUDA here; operands are Numba device arrays and the "
              "torch.matmul baseline is skipped")

        def to_dev(x):
            return cuda.to_device(x)

        def sync():
            cuda.synchronize()
    else:
        def to_dev(x):
            return torch.from_numpy(x).cuda()

        def sync():
            torch.cuda.synchronize()

    def timed(fn):
        def run():
            fn()
            sync()
        return run

    if torch is not None:
        tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = False
        try:
            a = to_dev(rng.standard_normal((n, n)).astype(np.float32))
            b = to_dev(rng.standard_normal((n, n)).astype(np.float32))
            relu = torch.relu(a)
            base = timed(lambda: torch.matmul(a, b))
            name = "torch.matmul fp32 cuda, TF32 off"
            for label, fn in [
                    (f"pam_matmul cuda f32 {n}^3", lambda: emu.pam_matmul(a, b)),
                    (f"pam_matmul cuda f32 {n}^3, relu A (zeros)", lambda: emu.pam_matmul(relu, b)),
                    (f"pam_matmul cuda f32 {n}^3, B transposed view", lambda: emu.pam_matmul(a, b.T)),
                    (f"pam_matmul cuda bf16 operands {n}^3", lambda: emu.pam_matmul(a, b, "bf16"))]:
                tc, tb = best_of(timed(fn), base, rep)
                rows.append(Row(label, tc, name, tb))
            m = n // 4                       # the integer adder is slow: a smaller problem
            am, bm = a[:m, :m].contiguous(), b[:m, :m].contiguous()
            tc, tb = best_of(timed(lambda: emu.pam_matmul(am, bm, "bf16", "bf16")),
                             timed(lambda: torch.matmul(am, bm)), rep)
            rows.append(Row(f"pam_matmul cuda bf16, bf16 acc {m}^3", tc, f"{name} {m}^3", tb))
            x = torch.randn(1 << 24, device="cuda")
            y = torch.randn(1 << 24, device="cuda")
            tc, tb = best_of(timed(lambda: emu.pam_mul(x, y)), timed(lambda: x * y), rep)
            rows.append(Row("pam_mul cuda f32, 16 M elements", tc, "torch x * y cuda", tb))
            rows.append(_torch_bridge_step(torch, timed, rep))
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32

    ha = rng.standard_normal((nc, nc)).astype(np.float32)
    hb = rng.standard_normal((nc, nc)).astype(np.float32)
    da, db = to_dev(ha), to_dev(hb)
    with threads(None) as used:
        tc, tb = best_of(timed(lambda: emu.pam_matmul(da, db)), lambda: emu.pam_matmul(ha, hb),
                         rep)
        rows.append(Row(f"pam_matmul cuda f32 {nc}^3", tc,
                        f"emu.pam_matmul CPU kernel, {used} threads", tb))
    return rows


def _torch_bridge_step(torch, timed, rep) -> Row:
    """A torch_bridge training step on CUDA tensors: the charlm transformer (1 block, d 64,
    seq 16, batch 8) with PAM matmuls (bf16, approx backward) and PAAdamW, against the
    native CUDA step."""
    import copy

    import torch_bridge as tb
    from sim.benches.torch import _step_fn
    from workloads.models import build_model
    torch.manual_seed(0)
    native = build_model("charlm", seq_len=16, dim=64, depth=1, heads=4).cuda()
    cfg = tb.PAMConfig("bf16", ops={"matmul"})
    pa = tb.convert(copy.deepcopy(native), cfg)
    base = _step_fn(native, None, torch.optim.AdamW(native.parameters(), lr=1e-3), 8,
                    device="cuda")
    cand = _step_fn(pa, cfg, tb.PAAdamW(pa.parameters(), lr=1e-3, config=cfg), 8,
                    device="cuda")
    tc, tb_ = best_of(timed(cand), timed(base), rep)
    return Row("torch_bridge train step cuda, charlm L1 d64 seq16 b8, PAM matmuls bf16", tc,
               "native fp32 step cuda", tb_)
