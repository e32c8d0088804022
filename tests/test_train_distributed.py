"""Scale-out: DDP (gloo, 2 CPU processes on loopback) with PAM modules and PAAdamW.

Guarantee under test (sim/train_distributed.py): after one step on a global batch split
in two, the all-reduced gradients of both ranks equal, bit for bit, the 1-process
combination ``g0 * 0.5 + g1 * 0.5`` of the two shard gradients, and so do the parameters
after the PA AdamW step.  The 1-process gradient of the whole global batch agrees only to
rounding (one PAM accumulation over all rows), which is checked loosely and reported.
"""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import torch

import torch_bridge as tb
from conftest import assert_bits_equal
from sim import train as T
from sim import train_distributed as TD
from sim.cli import main
from workloads.models import build_model

CONFIG = tb.PAMConfig("bf16", backward={"loss": "exact"})      # every op group PA


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.rand(16, 1, 8, 8, generator=g), torch.randint(10, (16,), generator=g)


def _model():
    torch.manual_seed(0)
    return tb.convert(build_model("vit", image_size=8, patch=2, dim=16, depth=1), CONFIG)


def _loss(net, x, y):
    return tb.functional.cross_entropy(net(x), y, label_smoothing=0.1, config=CONFIG)


def _step(model, grads):
    for p, g in zip(model.parameters(), grads):
        p.grad = g.clone()
    tb.PAAdamW(model.parameters(), lr=1e-2, config=CONFIG).step()
    return [p.detach().clone() for p in model.parameters()]


def _one_ddp_step():
    """On each rank: DDP forward/backward of its shard, then PAAdamW; rank 0 gathers."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    rank, size = T.world()
    model = _model()
    net = DistributedDataParallel(model)
    x, y = T._shard(*_batch(), rank, size)
    _loss(net, x, y).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    params = _step(model, grads)
    every = [None] * size
    dist.all_gather_object(every, (size, grads, params))
    return every


def _bits(ts):
    return np.concatenate([t.detach().reshape(-1).numpy() for t in ts])


def test_two_process_gradients_equal_single_process_bit_for_bit():
    ranks = TD.run(_one_ddp_step, 2)
    assert [r[0] for r in ranks] == [2, 2]
    x, y = _batch()
    shard_grads = []
    for r in range(2):
        model = _model()
        _loss(model, *T._shard(x, y, r, 2)).backward()
        shard_grads.append([p.grad.clone() for p in model.parameters()])
    want = TD.combine_shard_grads(shard_grads)
    want_params = _step(_model(), want)
    for rank, (_, grads, params) in enumerate(ranks):
        assert_bits_equal(_bits(grads), _bits(want), what=f"rank {rank} all-reduced grads")
        assert_bits_equal(_bits(params), _bits(want_params), what=f"rank {rank} params")
    # DDP really averaged: the result is neither shard's own gradient
    assert not np.array_equal(_bits(want), _bits(shard_grads[0]))
    # the full global batch in one process: the same gradient up to rounding only
    full = _model()
    _loss(full, x, y).backward()
    g_full = _bits([p.grad for p in full.parameters()])
    g = _bits(want)
    assert np.linalg.norm(g - g_full) <= 0.02 * np.linalg.norm(g_full)


def test_train_nproc_2_end_to_end(tmp_path, capsys):
    argv = ["train", "--nproc", "2", "--epochs", "2", "--max-steps", "30", "--out",
            str(tmp_path), "--quiet"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "DDP on 2 processes (gloo)" in out and "native float32" in out
    # the name carries every option changed from its default (issue 30)
    js = json.loads((tmp_path / "train_digits_mlp_bfloat16_epochs-2_max-steps-30_nproc-2.json")
                    .read_text())
    assert js["nproc"] == 2
    for run in js["runs"]:
        loss = run["step_loss"]
        assert run["steps"] == 30 and not run["diverged"]
        assert np.mean(loss[:8]) > np.mean(loss[-8:]) + 0.1
        assert run["evals"][-1]["acc"] > 0.3               # chance is 0.1
    assert list((tmp_path / "cache").glob("baseline-*-ddp2.json"))


def test_train_under_torchrun(tmp_path):
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
    with socket.socket() as s:                  # a free port for torchrun's rendezvous
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", port, "-m", "sim.cli", "train",
           "--max-steps", "6", "--epochs", "1", "--quiet", "--no-cache", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("DDP on 2 processes") == 1        # rank 0 alone reports
    js = tmp_path / "train_digits_mlp_bfloat16_epochs-1_max-steps-6.json"
    assert json.loads(js.read_text())["nproc"] == 2


@pytest.mark.parametrize("nproc,msg", [(0, "nproc must be a positive int"),
                                       (2.0, "nproc must be a positive int")])
def test_bad_nproc(nproc, msg):
    with pytest.raises(ValueError, match=msg):
        TD.run(print, nproc)


def test_bad_nproc_on_the_command_line(capsys):
    assert main(["train", "--nproc", "65"]) == 2
    assert "nproc must lie in [1, batch_size=64], got 65" in capsys.readouterr().err
