"""GRU, LSTM and Elman RNN layers with PAM gate matmuls and PA gate functions.

torch's cells, with torch's gate order and parameters (``_flat_weights``): the input
projection of every time step is one PAM linear over the whole sequence, the hidden
projection one PAM linear per step ('matmul' group); the gate functions are
:func:`~torch_bridge.elementwise.pa_sigmoid` / ``pa_tanh`` and the gate products PAMs
('elementwise' group); a group that is off runs torch's op.  Per step:

* GRU: ``r = σ(gi_r + gh_r)``, ``z = σ(gi_z + gh_z)``, ``n = tanh(gi_n + r ·̂ gh_n)``,
  ``h' = n + z ·̂ (h - n)`` (torch's ``(1-z)·n + z·h`` in increment form, one PAM);
* LSTM: ``i, f, o = σ(.)``, ``g = tanh(.)``, ``c' = f ·̂ c + i ·̂ g``, ``h' = o ·̂ tanh(c')``;
* RNN: ``h' = tanh(gi + gh)`` or ``relu(gi + gh)``.

Layers run in order, each direction over its time steps; dropout between layers is
torch's (a select and a constant scale).
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

import emu
from emu import sizes

from . import _compose
from . import composites as D
from . import elementwise as PE
from . import functional as PF
from ._recurrence import CELL_INPUTS, recurrence
from .config import blocked, check_numerics

__all__ = ["pa_recurrent"]

_GATES = {"gru": 3, "lstm": 4, "rnn_tanh": 1, "rnn_relu": 1}


class _Ops:
    """The cell's operations under ``config`` (PA where the group is on)."""

    def __init__(self, config):
        self.config = config
        self.pa = config.enabled("elementwise")
        self.nm = check_numerics(config.pa_fmt, config.kind("elementwise"), config.rounding,
                                 mul=config.mul if self.pa else None)

    def linear(self, x, w, b):
        return PF.linear(x, w, b, self.config)

    def tanh(self, x):
        nm = self.nm
        return PE.pa_tanh(x, nm.fmt, backward=nm.backward, rounding=nm.rounding,
                          mul=self.config.mul) if self.pa else torch.tanh(x)

    def sequence(self, mode, gi, h, c, w_hh, b_hh):
        """``(mm, ew)`` Numerics when a whole direction runs as one Function
        (torch_bridge._recurrence.Recurrence), else None: both groups PA, float32 CPU tensors,
        deterministic rounding, a float32 accumulator, products small enough for one
        kernel call, no autocast."""
        cfg = self.config
        if mode not in ("gru", "lstm") or not (self.pa and cfg.enabled("matmul")):
            return None
        if torch.is_autocast_enabled("cpu") or cfg.acc != emu.float32 or \
                cfg.mul != emu.MULTIPLIERS["pam"] or \
                blocked(cfg.fmt) or h.dim() != 2:
            return None
        if not _compose.fusable(cfg, gi, h, c, w_hh, b_hh) or \
                h.shape[0] * w_hh.numel() > sizes.SMALL or not gi.numel() or \
                gi[0].numel() > sizes.FUSED_MAX:
            return None
        return check_numerics(cfg.fmt, cfg.kind("matmul"), cfg.rounding, cfg.acc), self.nm



def _pa_cell(mode, nm, gi, gh, state):
    """The GRU or LSTM cell's gate arithmetic (composites.gru_cell / lstm_cell) on the
    gates' chunks and the state: its fused kernels for small float32 CPU tensors, else
    its graph; the same bits."""
    k = 3 if mode == "gru" else 4
    tensors = [*gi.chunk(k, -1), *gh.chunk(k, -1), state]
    desc, names = (D.gru_cell if mode == "gru" else D.lstm_cell), CELL_INPUTS[mode]
    if _compose.composite(nm, gi, gh, state) and all(
            t.dim() == 2 for t in (gi, gh, state)):
        return _compose.run(_compose.plan(desc, names), tensors, state.shape[-1], nm, {})
    return desc(_compose.GraphOps(PF.PRIMS, nm), **{n: t for (n, _), t in zip(names, tensors)})


def _cell(mode, ops, gi, h, c, w_hh, b_hh):
    gh = ops.linear(h, w_hh, b_hh)
    if ops.pa and mode == "gru":
        return _pa_cell(mode, ops.nm, gi, gh, h), None
    if ops.pa and mode == "lstm":
        return _pa_cell(mode, ops.nm, gi, gh, c)
    if mode == "gru":                   # torch's cells, the elementwise group off
        (ir, iz, in_), (hr, hz, hn) = gi.chunk(3, -1), gh.chunk(3, -1)
        r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
        n = torch.tanh(in_ + r * hn)
        return n + z * (h - n), None
    if mode == "lstm":
        i, f, g, o = (gi + gh).chunk(4, -1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c
    pre = gi + gh
    return (ops.tanh(pre) if mode == "rnn_tanh" else torch.relu(pre)), None


def pa_recurrent(mode, input, hx, params, has_biases, num_layers, dropout, train,
                 bidirectional, batch_first, config):
    """torch.gru / torch.lstm / torch.rnn_tanh / torch.rnn_relu (the padded-input form
    nn.GRU, nn.LSTM and nn.RNN call) under ``config``: ``(output, h_n)``, for the LSTM
    ``(output, h_n, c_n)``.  No projections (LSTM ``proj_size``)."""
    if mode not in _GATES:
        raise ValueError(f"mode={mode!r}; expected one of {sorted(_GATES)}")
    ops = _Ops(config)
    dirs = 2 if bidirectional else 1
    per = 4 if has_biases else 2
    if len(params) != num_layers * dirs * per:
        raise ValueError(f"{mode}: {len(params)} parameters do not fit {num_layers} layer(s), "
                         f"{dirs} direction(s), bias={has_biases} (projections unsupported)")
    x = input.transpose(0, 1) if batch_first else input                   # (T, N, H)
    h0, c0 = (hx[0], hx[1]) if mode == "lstm" else (hx, None)
    hs, cs = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            k = (layer * dirs + d) * per
            w_ih, w_hh = params[k], params[k + 1]
            b_ih, b_hh = (params[k + 2], params[k + 3]) if has_biases else (None, None)
            gi = ops.linear(x, w_ih, b_ih)                     # every step at once
            h, c = h0[layer * dirs + d], None if c0 is None else c0[layer * dirs + d]
            numerics = ops.sequence(mode, gi, h, c, w_hh, b_hh)
            if numerics is not None:            # the loop below as one Function
                y, h, c = recurrence(mode, gi, h, c, w_hh, b_hh, d == 1, *numerics)
                outs.append(y)
                hs.append(h)
                cs.append(c)
                continue
            steps = range(x.shape[0] - 1, -1, -1) if d else range(x.shape[0])
            ys = [None] * x.shape[0]
            for t in steps:
                h, c = _cell(mode, ops, gi[t], h, c, w_hh, b_hh)
                ys[t] = h
            outs.append(torch.stack(ys))
            hs.append(h)
            cs.append(c)
        x = torch.cat(outs, -1) if dirs == 2 else outs[0]
        if dropout and train and layer < num_layers - 1:
            x = F.dropout(x, dropout, True)
    out = x.transpose(0, 1) if batch_first else x
    if mode == "lstm":
        return out, torch.stack(hs), torch.stack(cs)
    return out, torch.stack(hs)
