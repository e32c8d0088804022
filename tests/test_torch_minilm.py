"""all-MiniLM-L6-v2 (pretrained, offline) on emulated PA hardware via pam_mode.

Floors measured with ``pamsim minilm`` on the 60 built-in sentences (2026-11, torch
2.13): bf16 PAM matmuls mean cosine 0.986 (min 0.967), matmul+softmax+layernorm
0.975 (min 0.951); the test uses the first 6 sentences with a small margin.
"""
import pytest
import torch

import torch_bridge as tb
from sim.cli import main
from sim.commands.minilm import SENTENCES, compare, embeddings


@pytest.fixture(scope="module")
def model():
    pytest.importorskip("sentence_transformers")
    from workloads.data import load_minilm
    return load_minilm()


def test_sentence_embeddings_stay_close_to_float32(model):
    assert len(SENTENCES) >= 50 and len(set(SENTENCES)) == len(SENTENCES)
    rows = compare(model, SENTENCES[:6], ["bf16"],
                   {"matmul": frozenset({"matmul"}),
                    "all": frozenset({"matmul", "softmax", "layernorm"})})
    by_ops = {r["ops"]: r for r in rows}
    assert by_ops["matmul"]["mean"] >= 0.975 and by_ops["matmul"]["min"] >= 0.955
    assert by_ops["all"]["mean"] >= 0.96 and by_ops["all"]["min"] >= 0.94
    # PA changes the numbers (the mode really is active), and more ops change them more
    assert by_ops["matmul"]["mean"] < 0.9999 and by_ops["all"]["mean"] < by_ops["matmul"]["mean"]


def test_native_config_changes_nothing(model):
    ref = embeddings(model, SENTENCES[:3])
    same = embeddings(model, SENTENCES[:3], tb.PAMConfig(None))
    assert torch.equal(ref, same)


def test_minilm_command(tmp_path, capsys):
    assert main(["minilm", "--fmts", "e8m3", "--ops", "matmul", "--sentences", "3",
                 "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "e8m3" in out and "mean cos" in out and (tmp_path / "minilm.json").exists()
