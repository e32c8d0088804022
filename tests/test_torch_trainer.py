"""The transformers Trainer with a PAMConfig (docs/torch_bridge.md, "transformers'
Trainer"): a tiny random-init GPT-2 built from its config, offline, trained a few steps
with each forward and backward under pam_mode and PAAdamW as the optimizer."""
import math
import os

import pytest
import torch

import torch_bridge as tb

os.environ.setdefault("HF_HUB_OFFLINE", "1")        # built from a config: nothing to fetch
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate")

CONFIG = tb.PAMConfig("bf16")


class PAMTrainer(transformers.Trainer):
    """The recipe: the model's forward and backward (training_step) and evaluation
    forward (prediction_step) run under pam_mode; None: the plain Trainer."""

    def __init__(self, *args, pam_config=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.pam_config = pam_config

    def training_step(self, *args, **kwargs):
        with tb.pam_mode(self.pam_config):
            return super().training_step(*args, **kwargs)

    def prediction_step(self, *args, **kwargs):
        with tb.pam_mode(self.pam_config):
            return super().prediction_step(*args, **kwargs)


def _gpt2():
    torch.manual_seed(0)
    conf = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2,
                                   n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                   pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return transformers.GPT2LMHeadModel(conf)


def _data(n=12, seq=8):
    ids = torch.randint(0, 64, (n, seq), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": row, "labels": row} for row in ids]


def _train(config, tmp_path):
    model, data = _gpt2(), _data()
    before = [p.detach().clone() for p in model.parameters()]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4, use_cpu=True,
        report_to=[], logging_steps=1, save_strategy="no", disable_tqdm=True,
        max_grad_norm=0.0)                   # clipping's norm and scaling would be native
    optimizer = tb.PAAdamW(model.parameters(), lr=1e-3, config=config)
    trainer = PAMTrainer(model=model, args=args, train_dataset=data, eval_dataset=data[:4],
                         optimizers=(optimizer, None), pam_config=config)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    losses.append(trainer.evaluate()["eval_loss"])
    return model, before, losses, data


def test_trainer_runs_pa_training_steps(tmp_path):
    model, before, losses, data = _train(CONFIG, tmp_path / "pa")
    assert len(losses) == 4 and all(math.isfinite(v) for v in losses), losses
    after = list(model.parameters())
    assert all(not torch.equal(a, b) for a, b in zip(before, after))   # every one trained
    batch = {k: torch.stack([d[k] for d in data[:4]]) for k in ("input_ids", "labels")}
    assert tb.audit(model, batch, CONFIG).escaped == 0
    native, _, native_losses, _ = _train(None, tmp_path / "native")
    assert losses != native_losses                  # the steps ran on PA arithmetic
    assert any(not torch.equal(a, b) for a, b in zip(after, native.parameters()))
