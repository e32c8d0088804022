"""torch.compile and the PA entry points: Dynamo must never trace torch_bridge.

Dynamo could trace into pam_mode's handlers and the drop-ins' forwards, but what it
would specialise on there (the config, the operands' formats) it does not guard: a
compiled model reused under a second config ran the first one's trace, with wrong
bits.  The entry points (``_PAMMode.__torch_function__``, the drop-ins' ``forward``)
are therefore wrapped by :func:`eager_under_compile`: Dynamo breaks the graph at each
call and the call runs eagerly, as ``torch.compiler.disable`` does.

Not a private (``_``) module on purpose: the audit counts an aten op as emulated when a
frame of a ``torch_bridge._*`` module is on the stack, and this wrapper's frame is on
the stack of every op a model runs under pam_mode.
"""
from __future__ import annotations

import functools
import sys

import torch

__all__ = ["eager_under_compile"]


def eager_under_compile(fn):
    """``fn`` as torch.compile must see it: marked as ``torch.compiler.disable`` marks a
    function (Dynamo breaks the graph at the call instead of tracing it) and, once Dynamo
    is loaded, run through ``torch.compiler.disable(fn)``, so that nothing it calls is
    compiled either.  Before Dynamo is loaded, a plain call: importing Dynamo costs a
    second, and nothing can be compiling."""
    disabled = []

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        if not disabled:
            disabled.append(torch.compiler.disable(fn))
        return disabled[0](*args, **kwargs)

    call._torchdynamo_disable = True        # what torch.compiler.disable sets: never traced
    return call
