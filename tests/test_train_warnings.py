"""Issue 30: training that cannot learn says so in its first epoch, a log file sees a
line per epoch, and runs that differ in one option never overwrite each other."""
import json
import warnings

import pytest
import torch
from torch import nn

import torch_bridge as tb
from sim.cli import main
from torch_bridge.diagnostics import LearningWarning, watch

ONE_EPOCH = ["train", "--epochs", "1"]          # the digits MLP: 23 steps


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_e4m3fn_warns_in_its_first_epoch_and_ops_runs_both_survive(tmp_path, capsys):
    """Gradients below e4m3's smallest normal 2^-6 flush: the run says so, with the
    remedy; the all-ops and the matmul-only runs write two files."""
    argv = [*ONE_EPOCH, "--fmt", "e4m3fn", "--out", str(tmp_path)]
    for ops in ("all", "matmul"):
        with pytest.warns(LearningWarning) as got:
            assert main([*argv, "--ops", ops]) == 0
        text = [str(w.message) for w in got]
        assert any("gradients" in t and "flush to zero" in t and "2^-6" in t
                   and "e5m2" in t for t in text), text
        assert any("loss did not fall" in t for t in text), text
    out = capsys.readouterr().out
    assert "PAM (float8_e4m3fn all-ops approx (exact: loss)) epoch 1/1: train loss" in out
    runs = {p.name: json.loads(p.read_text())["config"] for p in tmp_path.glob("*.json")}
    assert runs == {"train_digits_mlp_float8_e4m3fn_epochs-1.json":
                    "float8_e4m3fn all-ops approx (exact: loss)",
                    "train_digits_mlp_float8_e4m3fn_epochs-1_ops-matmul.json":
                    "float8_e4m3fn matmul approx"}


def test_bf16_does_not_warn(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error", LearningWarning)
        assert main([*ONE_EPOCH, "--out", str(tmp_path), "--quiet"]) == 0


def test_a_converted_model_warns_after_its_watched_steps():
    """torch_bridge users: watch() reports by itself at the first forward pass after
    its ``steps``; saturation is a cause of its own."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    cfg = tb.PAMConfig("e4m3fn")
    tb.convert(model, cfg)
    w = watch(model, cfg, steps=2)
    x, y = 1000 * torch.randn(8, 16), torch.randint(0, 4, (8,))    # beyond e4m3fn's 448
    with pytest.warns(LearningWarning, match="saturate.*activations of layer '0'"):
        for _ in range(3):
            nn.functional.cross_entropy(model(x), y).backward()
    assert w.closed and w.seen == 2
