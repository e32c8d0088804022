"""Scale-out: training simulations as data-parallel torch.distributed jobs (gloo, CPU).

``pamsim train --nproc N`` trains with DistributedDataParallel on N processes: PAM
modules (torch_bridge.convert) and PAAdamW run unchanged on every rank; DDP averages
the gradients between the backward pass and the optimizer step (sim.train.train does
the sharding).  Two ways in:

* launched by ``torchrun --nproc-per-node N -m sim.cli train ...``: this process is
  one rank and joins the group from torchrun's environment (``env://``);
* otherwise :func:`run` spawns N local processes (torch.multiprocessing) that meet
  through a file store and talk gloo over loopback.

What is guaranteed about the numbers: DDP multiplies each rank's gradient by 1/N
while copying it into its bucket, then gloo all-reduces the buckets by summation.  For
N = 2 the all-reduced gradient is ``g0 * 0.5 + g1 * 0.5`` in float32 (the sum of two
terms is commutative, so gloo's order cannot matter): bit for bit what one process
gets by computing the two shard gradients and combining them that way
(:func:`combine_shard_grads`, tests/test_train_distributed.py).  It is *not* bit-equal
to one process back-propagating the mean loss of the whole global batch, where each
weight gradient is one PAM matmul accumulating all 2B rows in one k-order (and the
loss mean divides once): that agrees only to float32/PAM rounding.  For N > 2 the
ring all-reduce adds the N terms in an order that depends on the chunk, so the result
equals a 1-process combination only up to reassociation of N float32 additions.
"""
from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Callable

import torch

__all__ = ["torchrun_world_size", "run", "combine_shard_grads"]


def torchrun_world_size() -> int | None:
    """The group size if this process was started by torchrun (env:// variables), else None."""
    if all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return int(os.environ["WORLD_SIZE"])
    return None


def _under_torchrun(backend: str, fn: Callable, args: tuple):
    """``fn(*args)`` as this torchrun rank.  A group joined here is destroyed here: one
    left to the interpreter's exit destroys gloo's threads unjoined, and the C++
    runtime aborts the rank ("terminate called without an active exception")."""
    import torch.distributed as dist
    if dist.is_initialized():
        return fn(*args)
    dist.init_process_group(backend, init_method="env://")
    try:
        out = fn(*args)
        dist.barrier()              # no rank closes its pairs while another still reads
        return out
    finally:
        dist.destroy_process_group()


def _worker(rank: int, nproc: int, store: str, result: str, threads: int, backend: str,
            fn: Callable, args: tuple):
    import torch.distributed as dist
    if threads:
        torch.set_num_threads(threads)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank,
                            world_size=nproc)
    try:
        out = fn(*args)
        if rank == 0:
            Path(result).write_bytes(pickle.dumps(out))
    finally:
        dist.destroy_process_group()


def run(fn: Callable, nproc: int, *args, threads: int = 1, backend: str = "gloo"):
    """``fn(*args)`` on every rank of an ``nproc``-process group (``backend``: gloo on
    the CPU, nccl for CUDA training); rank 0's result.

    Under torchrun the current process is one rank (``nproc`` must equal WORLD_SIZE) and
    every rank returns its own result (only rank 0's carries the evaluations).
    Otherwise ``nproc`` processes are spawned, each with ``threads`` torch threads, and
    ``fn`` must be picklable (a module-level function).  ``nproc == 1``: just ``fn(*args)``.
    """
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive int, got {nproc!r}")
    launched = torchrun_world_size()
    if launched is not None:
        if nproc not in (1, launched):
            raise ValueError(f"nproc={nproc} but torchrun started WORLD_SIZE={launched} "
                             "processes; omit --nproc under torchrun or make them agree")
        return _under_torchrun(backend, fn, args)
    if nproc == 1:
        return fn(*args)
    import torch.multiprocessing as mp
    # spawned ranks are local: gloo talks over loopback whatever the host name resolves to
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    with tempfile.TemporaryDirectory(prefix="pamsim-ddp-") as tmp:
        store, result = os.path.join(tmp, "store"), os.path.join(tmp, "result.pkl")
        mp.spawn(_worker, args=(nproc, store, result, threads, backend, fn, args), nprocs=nproc,
                 join=True)
        return pickle.loads(Path(result).read_bytes())


def combine_shard_grads(shard_grads: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """What DDP's all-reduce makes of per-shard gradients, computed in one process:
    each scaled by 1/N (as DDP's reducer does while bucketing), then summed in rank
    order.  Bit-equal to the 2-process gloo result (see the module docstring)."""
    n = len(shard_grads)
    out = [g * (1.0 / n) for g in shard_grads[0]]
    for grads in shard_grads[1:]:
        out = [a + g * (1.0 / n) for a, g in zip(out, grads)]
    return out
