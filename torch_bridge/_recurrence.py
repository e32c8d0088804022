"""GRU and LSTM layers, one direction as one autograd Function.

recurrent.pa_recurrent runs a layer step by step: per step the hidden projection (a
PAM linear) and the cell's gate arithmetic (torch_bridge/composites.py ``gru_cell`` /
``lstm_cell``).  :class:`Recurrence` runs the same steps inside one Function: the
projection with LinearFunction's kernels and the cell with the kernels generated from
its description (torch_bridge/_compose.py), and accumulates every gradient in the
order autograd accumulates the per-step graph's (tests/test_fused.py proves the bits
equal).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from emu.grad import host_matmul_grad

from . import _nodes as N_
from . import composites as D
from ._compose import backward, consts, forward, plan
from ._lean import kernel_consts, round_lean
from ._linear import LINEAR
from ._sums import fold_to
from ._tensors import host_view, kernel_fmt

#: the cells' inputs, in the order of their descriptions (gate chunks, then the state)
CELL_INPUTS = {
    "gru": tuple((n, "e") for n in ("ir", "iz", "in_", "hr", "hz", "hn", "h")),
    "lstm": tuple((n, "e") for n in ("xi", "xf", "xg", "xo", "hi", "hf", "hg", "ho", "c")),
}


def _cell_plan(mode):
    return plan(D.gru_cell if mode == "gru" else D.lstm_cell, CELL_INPUTS[mode])


def _chunks(a: np.ndarray, k: int) -> list:
    """The (rows, G·H) gate array's k column blocks, as views (torch's chunk(k, -1))."""
    h = a.shape[1] // k
    return [a[:, i * h:(i + 1) * h] for i in range(k)]


class _State(NamedTuple):
    """What Recurrence's forward keeps for its backward."""
    steps: list
    hraw: np.ndarray        # each step's h, as it came
    hrnd: np.ndarray        # and rounded for the product
    ghs: np.ndarray         # each step's hidden projection
    craw: np.ndarray | None  # each step's c (LSTM)
    rw: np.ndarray          # W_hh rounded
    cell: object            # the cell's plan
    c: np.ndarray           # its constants
    nmm: object             # kernel constants of the projection
    nme: object             # and of the gates
    fcm: object             # the projection's kernel format constants


def _sum_in_order(*terms):
    """Gradient contributions (numpy arrays or None) added left to right, as autograd
    adds them in its buffer; None if there is none."""
    acc = None
    for t in terms:
        if t is not None:
            acc = t if acc is None else acc + t
    return acc


class Recurrence(torch.autograd.Function):
    """One direction of a GRU or LSTM layer (recurrent.pa_recurrent's loop over steps) as
    one Function: per step the hidden projection (LinearFunction's kernels: R(h), R(W_hh),
    products, + b_hh) and the fused gate arithmetic, every gradient accumulated in the
    order the per-step graph accumulates it: a step's output h gets the output stack's
    slice (and h_T's, for the last step) first, then the next step's gate term (GRU) and
    projection term; W_hh and b_hh the steps' terms from the last step back; gi the
    steps' slices (zeros elsewhere: a -0 becomes +0 once two steps add up).  Outputs
    (ys, h_T[, c_T]); inputs gi (T, N, G·H), h0, c0, W_hh, b_hh."""

    @staticmethod
    def forward(ctx, spec, gi, h0, c0, w, b):
        mode, reverse, mm, ew = spec
        mfmt, mround, efmt, eround = mm.fmt, mm.rounding, ew.fmt, ew.rounding
        T, N, GH = gi.shape
        H = h0.shape[1]
        nmm, nme = kernel_consts(mfmt, mround), kernel_consts(efmt, eround)
        fcm = kernel_fmt(mfmt).consts
        gin = host_view(gi.detach().contiguous())
        wn = host_view(w.detach().contiguous())
        rw = wn if nmm.f32 else np.empty_like(wn)
        bias = None if b is None else b.detach()
        cell = _cell_plan(mode)
        c = consts(cell, efmt, eround, {})
        steps = list(range(T - 1, -1, -1) if reverse else range(T))
        ys = np.empty((T, N, H), np.float32)
        hraw = np.empty((T, N, H), np.float32)             # each step's h, as it came
        hrnd = hraw if nmm.f32 else np.empty_like(hraw)     # and rounded for the product
        ghs = np.empty((T, N, GH), np.float32)
        craw = np.empty((T, N, H), np.float32) if mode == "lstm" else None
        h = host_view(h0.detach().contiguous())
        cc = None if c0 is None else host_view(c0.detach().contiguous())
        for t in steps:
            hraw[t] = h
            LINEAR[0](hraw[t], wn, hrnd[t], rw, ghs[t], not nmm.f32, nmm.fc, nmm.mode, fcm, 0)
            if bias is not None:
                torch.from_numpy(ghs[t]).add_(bias)         # LinearFunction's y + bias
            if mode == "gru":
                forward(cell, nme, c, [*_chunks(gin[t], 3), *_chunks(ghs[t], 3), hraw[t]],
                        [ys[t]], H)
            else:
                craw[t] = cc
                cc = np.empty((N, H), np.float32)
                forward(cell, nme, c, [*_chunks(gin[t], 4), *_chunks(ghs[t], 4), craw[t]],
                        [ys[t], cc], H)
            h = ys[t]
        ctx.save_for_backward(gi, h0, c0, w, b)
        ctx.spec = spec
        ctx.state = _State(steps, hraw, hrnd, ghs, craw, rw, cell, c, nmm, nme, fcm)
        ctx.set_materialize_grads(False)
        out = torch.from_numpy(ys), torch.from_numpy(ys[steps[-1]].copy())
        return out + (torch.from_numpy(cc),) if mode == "lstm" else out

    @staticmethod
    def backward(ctx, g_ys, g_hT, g_cT=None):
        steps, hraw, hrnd, ghs, craw, rw, cell, c, nmm, nme, fcm = ctx.state
        mode, _, mm, ew = ctx.spec
        mfmt, macc, mkind, mround, ekind = mm.fmt, mm.acc, mm.backward, mm.rounding, ew.backward
        gi, _, _, _, b = ctx.saved_tensors
        T, N, GH = gi.shape
        H = hraw.shape[2]
        gin = host_view(gi.detach().contiguous())
        gy = None if g_ys is None else host_view(g_ys.float().contiguous())
        ek = N_.EXACT if ekind == "exact" else N_.APPROX
        dgi = np.empty((T, N, GH), np.float32)
        dghs = np.empty((T, N, GH), np.float32) if mode == "gru" else dgi   # δgh per step
        dw = dh_gate = dx = None
        dc = None if g_cT is None else host_view(g_cT.float().contiguous())
        for k in range(T - 1, -1, -1):
            t = steps[k]
            first = [] if k < T - 1 or g_hT is None else [host_view(g_hT.float().contiguous())]
            dh = _sum_in_order(*first, None if gy is None else gy[t], dh_gate, dx)
            if mode == "gru":
                dgh = dghs[t]
                dh_gate = np.empty((N, H), np.float32)
                backward(cell, nme, c, ek, [*_chunks(gin[t], 3), *_chunks(ghs[t], 3), hraw[t]],
                         [dh], [*_chunks(dgi[t], 3), *_chunks(dgh, 3), dh_gate], H)
            else:
                dgh = dgi[t]                                # g_gi = g_gh = δ(gi + gh)
                dcp = np.empty((N, H), np.float32)
                backward(cell, nme, c, ek, [*_chunks(gin[t], 4), *_chunks(ghs[t], 4), craw[t]],
                         [dh, dc], [*_chunks(dgi[t], 4), *_chunks(dgh, 4), dcp], H)
                dc = dcp
            if mkind == "approx":                           # LinearFunction's backward
                dx = np.empty((N, H), np.float32)
                dwt = np.empty((GH, H), np.float32)
                LINEAR[1](hrnd[t], rw, dgh, dgh if nmm.f32 else np.empty_like(dgh), dx, dwt,
                          not nmm.f32, nmm.fc, nmm.mode, fcm, 0, True, True)
            else:
                g = host_view(round_lean(torch.from_numpy(dgh), mfmt, mround))
                dx, dB = host_matmul_grad(hrnd[t], rw.T, g, kernel_fmt(mfmt), macc, mkind,
                                          (True, True))
                dwt = dB.T
            dw = dwt if dw is None else dw + dwt
        db = None
        if b is not None:       # each step's LinearFunction bias term (a fold over N), last first
            dbt = host_view(fold_to(torch.from_numpy(dghs), (T, 1, GH))).reshape(T, GH)
            db = dbt[steps[-1]]
            for k in range(T - 2, -1, -1):
                db = db + dbt[steps[k]]
            db = torch.from_numpy(np.ascontiguousarray(db)).reshape(b.shape)
        dh0 = _sum_in_order(dh_gate, dx)
        if T >= 2:              # the steps' select_backward zeros: -0 + +0 = +0
            dgi += np.float32(0.0)
        return (None, torch.from_numpy(dgi), None if dh0 is None else torch.from_numpy(dh0),
                None if mode != "lstm" or dc is None else torch.from_numpy(dc),
                torch.from_numpy(np.ascontiguousarray(dw)), db)


def recurrence(mode, gi, h0, c0, w, b, reverse, mm, ew):
    """Recurrence of one layer direction: ``(ys, h_T, c_T)`` (c_T None for the GRU);
    ``mm``, ``ew``: the checked :class:`~torch_bridge.config.Numerics` of the projection
    and of the gates."""
    out = Recurrence.apply((mode, reverse, mm, ew), gi, h0, c0, w, b)
    return out if mode == "lstm" else (out[0], out[1], None)
