"""Training simulations: train a model on emulated PA hardware next to its float32 baseline.

The question (Kosson & Jaggi, sections 3.2-3.4 and Appendix D): does a network still
train when its multiplications — matmuls, softmax, layer norm, loss, optimizer — are
piecewise affine, at a given mantissa width and with exact or approximate derivatives?
:func:`train` runs one configuration on one seed; the PAM run and the native float32
baseline share the seed, so they start from the same weights and see the same batches.
Every PA number comes from torch_bridge (hence emu).

Data (offline, workloads.data): ``digits`` (sklearn 8x8), ``mnist`` (5,000-image subset),
``text`` (KJV characters, a causal character-level transformer).  Metrics are computed
natively on the model's logits, so PAM and baseline are measured the same way:
classification — test cross-entropy and accuracy; text — validation bits per
character and next-character accuracy.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from numba.core import event as numba_event

import torch_bridge as tb
from torch_bridge import diagnostics
from workloads.models import HEADS, MODELS, build_model

DATASETS = ("digits", "mnist", "text")
DEFAULT_MODEL = {"digits": "mlp", "mnist": "vit", "text": "charlm"}
#: a model's revision, in the cache keys of its runs: bumped when the model a TrainSpec
#: builds changes, so that no cached run of the old model is reused (vit 2: mean pooling,
#: 4x4 patches on the 8x8 digits; issue 17)
MODEL_REVISION = {"vit": 2}
#: torch_bridge's numerics revision, in every cache key (:meth:`TrainSpec.key`, so
#: :func:`run_key` too): bumped when torch_bridge's bits change, so that no cached run of
#: the old numerics is reused (2: every float32 sum of torch_bridge in emu.fold_sum's order)
NUMERICS_REVISION = 2
#: bounds of a TrainSpec beyond which a run cannot fit this machine (or the seed the RNGs)
MAX_BATCH, MAX_DIM, MAX_DEPTH, MAX_SEED = 1 << 16, 4096, 64, 2 ** 32 - 1


def _interval(lo, hi) -> str:
    """The accepted range as a message states it: ``[lo, hi]``, or ``[lo, inf)`` where
    there is no upper bound (infinity itself is refused)."""
    return f"[{lo}, inf)" if hi is None or hi == math.inf else f"[{lo}, {hi}]"


@dataclass(frozen=True)
class TrainSpec:
    """Everything about a training run except its PAMConfig (hashable, JSON-able)."""
    data: str = "digits"
    model: str = ""                      # "": the data set's default (DEFAULT_MODEL)
    epochs: int = 12
    batch_size: int = 64
    lr: float = 3e-3
    weight_decay: float = 0.01
    label_smoothing: float = 0.1
    warmup: float = 0.05                 # fraction of the steps with linear warm-up
    seed: int = 0
    optimizer: str = "adamw"
    max_steps: int = 0                   # > 0: stop after this many steps (tests, quick runs)
    train_subset: int = 0                # > 0: use only this many training examples
    dim: int = 0                         # > 0: transformer width (vit, charlm)
    depth: int = 0                       # > 0: transformer blocks (vit, charlm)
    seq_len: int = 64                    # text: characters per sequence
    steps_per_epoch: int = 100           # text: an "epoch" is this many batches
    text_chars: int = 400_000            # text: the first characters of the KJV used
    device: str = "cpu"                  # "cpu" or "cuda" (under DDP: each rank's GPU)

    def __post_init__(self):
        if self.data not in DATASETS:
            raise ValueError(f"data={self.data!r}; expected one of {DATASETS}")
        model = self.model or DEFAULT_MODEL[self.data]
        if model not in MODELS:
            raise ValueError(f"model={model!r}; expected one of {tuple(MODELS)}")
        if (self.data == "text") != (model == "charlm"):
            raise ValueError(f"model={model!r} does not fit data={self.data!r}: the text data "
                             "trains the charlm model, images train mlp, cnn or vit")
        object.__setattr__(self, "model", model)
        ints = {"epochs": (1, None), "batch_size": (1, MAX_BATCH), "seq_len": (1, None),
                "steps_per_epoch": (1, None), "text_chars": (1, None), "max_steps": (0, None),
                "train_subset": (0, None), "dim": (0, MAX_DIM), "depth": (0, MAX_DEPTH),
                "seed": (0, MAX_SEED)}
        for name, (lo, hi) in ints.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi and v > hi):
                raise ValueError(f"{name} must be an int in {_interval(lo, hi)}, got {v!r}")
        if (self.dim or self.depth) and model not in ("vit", "charlm"):
            raise ValueError(f"dim={self.dim}, depth={self.depth}: only the transformers (vit, "
                             f"charlm) take a width and depth, not model={model!r}")
        if self.dim % HEADS:
            raise ValueError(f"dim={self.dim} must be 0 (the model's default) or a multiple "
                             f"of the {HEADS} attention heads")
        floats = {"lr": (0, math.inf), "weight_decay": (0, math.inf),
                  "label_smoothing": (0, 1), "warmup": (0, 1)}
        for name, (lo, hi) in floats.items():
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) \
                    or not (math.isfinite(v) and lo <= v <= hi):
                raise ValueError(f"{name} must be a finite number in {_interval(lo, hi)}, "
                                 f"got {v!r}")
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer={self.optimizer!r}; expected 'adamw' or 'sgd'")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device={self.device!r}; expected 'cpu' or 'cuda'")

    def key(self) -> str:
        """A short hash of the spec (the torch version, torch_bridge's numerics revision,
        the model's revision): the baseline cache key."""
        rev = [MODEL_REVISION[self.model]] if self.model in MODEL_REVISION else []
        blob = json.dumps([asdict(self), torch.__version__, NUMERICS_REVISION, *rev],
                          sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def replace(self, **kw) -> "TrainSpec":
        return TrainSpec(**{**asdict(self), **kw})

    def label(self) -> str:
        return f"{self.model} on {self.data}"


@dataclass
class RunResult:
    """One training run: per-step training loss and per-epoch evaluations."""
    name: str
    config: str                          # PAMConfig.describe() or "native"
    seed: int
    step_loss: list = field(default_factory=list)
    evals: list = field(default_factory=list)
    seconds: float = 0.0                 # training, without compiling kernels
    steps: int = 0
    diverged: bool = False
    compile_seconds: float = 0.0         # Numba compiling (or loading) kernels meanwhile

    @property
    def final(self) -> dict:
        return self.evals[-1] if self.evals else {}

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d) -> "RunResult":
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


# --- data ---------------------------------------------------------------------------------

class _Images:
    def __init__(self, spec: TrainSpec):
        from workloads import data
        split = data.digits(spec.seed) if spec.data == "digits" else data.mnist(spec.seed)
        x_train, y_train = split.x_train, split.y_train
        if spec.train_subset:
            x_train, y_train = x_train[:spec.train_subset], y_train[:spec.train_subset]
        shape = (1, *split.image_shape)
        self.x_train = torch.from_numpy(x_train).reshape(-1, *shape)
        self.y_train = torch.from_numpy(y_train)
        self.x_test = torch.from_numpy(split.x_test).reshape(-1, *shape)
        self.y_test = torch.from_numpy(split.y_test)
        self.side = split.image_shape[0]
        self.batch = spec.batch_size
        self.steps_per_epoch = math.ceil(len(self.y_train) / self.batch)
        self.rng = np.random.default_rng(spec.seed)

    def model_kwargs(self, spec):
        if spec.model == "mlp":
            return {"in_features": self.side * self.side}
        if spec.model == "cnn":
            return {"image_size": self.side}
        # 4x4 patches of the 8x8 digits (2x2 patches carry 4 pixels each, and a 1-block
        # ViT on them learns as slowly as it learns its position embeddings: issue 17,
        # docs/studies.md) and global average pooling instead of a class token
        kw = {"image_size": self.side, "patch": 4 if self.side == 8 else 7, "pool": "mean"}
        kw.update({k: v for k, v in (("dim", spec.dim), ("depth", spec.depth)) if v})
        return kw

    def epoch(self):
        order = torch.from_numpy(self.rng.permutation(len(self.y_train)))
        for i in range(0, len(order), self.batch):
            idx = order[i:i + self.batch]
            yield self.x_train[idx], self.y_train[idx]

    def eval_batches(self):
        for i in range(0, len(self.y_test), 500):
            yield self.x_test[i:i + 500], self.y_test[i:i + 500]


class _Text:
    def __init__(self, spec: TrainSpec):
        from workloads import data
        corpus = data.kjv_chars(spec.text_chars)
        self.vocab = len(corpus.vocab)
        self.train = torch.from_numpy(corpus.train)
        self.val = torch.from_numpy(corpus.val)
        self.L = spec.seq_len
        self.batch = spec.batch_size
        self.steps_per_epoch = spec.steps_per_epoch
        self.rng = np.random.default_rng(spec.seed)
        vrng = np.random.default_rng(12345)              # the same windows for every run
        self.val_starts = torch.from_numpy(vrng.integers(0, len(self.val) - self.L - 1, 256))

    def model_kwargs(self, spec):
        kw = {"vocab": self.vocab, "seq_len": self.L}
        kw.update({k: v for k, v in (("dim", spec.dim), ("depth", spec.depth)) if v})
        return kw

    def _windows(self, tokens, starts):
        idx = starts[:, None] + torch.arange(self.L + 1)
        w = tokens[idx]
        return w[:, :-1], w[:, 1:]

    def epoch(self):
        for _ in range(self.steps_per_epoch):
            starts = torch.from_numpy(self.rng.integers(0, len(self.train) - self.L - 1,
                                                        self.batch))
            yield self._windows(self.train, starts)

    def eval_batches(self):
        for i in range(0, len(self.val_starts), 64):
            yield self._windows(self.val, self.val_starts[i:i + 64])


def _dataset(spec):
    return _Text(spec) if spec.data == "text" else _Images(spec)


# --- the loop ---------------------------------------------------------------------------

def _flat(logits, y):
    return logits.reshape(-1, logits.shape[-1]), y.reshape(-1)


@torch.no_grad()
def evaluate(model, data, text: bool) -> dict:
    """Native metrics of the model's logits (PA forward for a converted model)."""
    model.eval()
    loss = correct = count = 0.0
    device = next(model.parameters()).device
    for x, y in data.eval_batches():
        z, t = _flat(model(x.to(device)), y.to(device))
        loss += F.cross_entropy(z, t, reduction="sum").item()
        correct += (z.argmax(-1) == t).sum().item()
        count += t.numel()
    model.train()
    out = {"loss": loss / count, "acc": correct / count}
    if text:
        out["bpc"] = out["loss"] / math.log(2)
    return out


def _schedule(opt, total, warmup):
    """Linear warm-up then cosine decay (the paper's schedules), host arithmetic."""
    n_warm = max(1, int(total * warmup))

    def factor(step):
        if step < n_warm:
            return (step + 1) / n_warm
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - n_warm) / max(1, total - n_warm))))
    return torch.optim.lr_scheduler.LambdaLR(opt, factor)


def world() -> tuple[int, int]:
    """(rank, size) of this process's torch.distributed group; (0, 1) outside one."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _shard(x, y, rank, size):
    """This rank's equal share of a global batch; the remainder (fewer than ``size``
    examples) is dropped so DDP's mean of shard means is the global-batch mean."""
    n = len(y) // size
    return x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n]


def train(spec: TrainSpec, config: tb.PAMConfig | None, name: str | None = None,
          progress: bool = True) -> RunResult:
    """Train ``spec``'s model under ``config`` (None: native float32) on ``spec.seed``.

    Inside a torch.distributed group of N > 1 processes (sim.train_distributed) this is
    data-parallel training with DistributedDataParallel: every rank draws the same global
    batch, trains on its 1/N share, and DDP averages the gradients; ``batch_size`` is the
    global batch.  Rank 0 evaluates, shows progress and holds the complete result.
    """
    rank, size = world()
    if spec.batch_size < size:
        raise ValueError(f"batch_size={spec.batch_size} is smaller than the {size} processes")
    data = _dataset(spec)
    torch.manual_seed(spec.seed)
    model = build_model(spec.model, **data.model_kwargs(spec))
    tb.convert(model, config)
    device = torch.device("cpu")
    if spec.device == "cuda":           # under DDP (nccl) one GPU per rank
        device = torch.device("cuda", rank % torch.cuda.device_count())
        model.to(device)
    net = model
    if size > 1:
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model, device_ids=None if device.index is None
                                      else [device.index])
        # distinct stochastic-rounding streams per rank (rank 0 keeps the 1-process one)
        if rank:
            torch.manual_seed(spec.seed * 65537 + rank)
    total = spec.epochs * data.steps_per_epoch
    if spec.max_steps:
        total = min(total, spec.max_steps)
    hyper = {"lr": spec.lr, "weight_decay": spec.weight_decay}
    if spec.optimizer == "sgd":
        hyper["momentum"] = 0.9
    opt = tb.make_optimizer(spec.optimizer, model.parameters(), config, **hyper)
    sched = _schedule(opt, total, spec.warmup)
    text = spec.data == "text"
    res = RunResult(name or ("float32" if config is None else "PAM"),
                    "native float32" if config is None else config.describe(), spec.seed)
    watch = diagnostics.watch(model, config, data.steps_per_epoch) if rank == 0 else None
    with numba_event.install_listener("numba:compile", numba_event.TimingListener()) as clock:
        _loop(spec, config, data, net, model, opt, sched, res, watch, total, text, device,
              rank, size, progress)
    # a first run compiles kernels (once per machine: Numba caches them): reported apart,
    # so the training time is the one every later run shows
    res.compile_seconds = clock.duration if clock.done else 0.0
    res.seconds = max(0.0, res.seconds - res.compile_seconds)
    return res


def _loop(spec, config, data, net, model, opt, sched, res, watch, total, text, device, rank,
          size, progress):
    """The training loop of :func:`train` (``res.seconds``: its wall time)."""
    from tqdm.auto import tqdm
    t0 = time.perf_counter()
    bar = tqdm(total=total, desc=f"{res.name} ({res.config})",
               disable=None if progress and rank == 0 else True, leave=False,
               dynamic_ncols=True)
    step = 0
    for epoch in range(spec.epochs):
        for x, y in data.epoch():
            if size > 1:
                x, y = _shard(x, y, rank, size)
                if not len(y):
                    continue
            x, y = x.to(device), y.to(device)
            logits = net(x)
            loss = tb.functional.cross_entropy(*_flat(logits, y),
                                               label_smoothing=spec.label_smoothing,
                                               config=config)
            value = loss.item() if size == 1 else _global_mean(loss)
            res.step_loss.append(value)
            if not math.isfinite(value):
                res.diverged = True
                break
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            bar.update()
            if step % 10 == 0:
                bar.set_postfix(loss=f"{np.mean(res.step_loss[-10:]):.3f}")
            if step >= total:
                break
        if rank == 0:
            ev = evaluate(model, data, text)
            ev.update(epoch=epoch + 1, step=step,
                      train_loss=float(np.mean(res.step_loss[-data.steps_per_epoch:])))
            res.evals.append(ev)
            if progress and bar.disable:        # no terminal: a line a log file can read
                print(f"{res.name} ({res.config}) epoch {epoch + 1}/{spec.epochs}: train "
                      f"loss {ev['train_loss']:.4f}, {_epoch_metric(spec, ev)} "
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
            if epoch == 0:
                watch.close(res.step_loss)
        if res.diverged or step >= total:
            break
    bar.close()
    res.steps = step
    res.seconds = time.perf_counter() - t0


def _global_mean(loss: torch.Tensor) -> float:
    """The mean over ranks of the shard losses (what DDP's gradient is the gradient of)."""
    import torch.distributed as dist
    t = loss.detach().reshape(1).clone()
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def run_key(spec: TrainSpec, config: tb.PAMConfig | None) -> str:
    """A short hash of everything that determines a run: the spec and the config."""
    cfg = None if config is None else [config.fmt.name, list(config._kinds),
                                       sorted(config.ops), config.rounding, config.acc.name,
                                       config.pa_fmt.name]
    if cfg is not None and str(config.mul) != "pam":    # PAM's keys stay as they were
        cfg.append(str(config.mul))
    blob = json.dumps([spec.key(), cfg], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cached_run(spec: TrainSpec, config: tb.PAMConfig | None, name: str, path: Path | None,
               progress=True) -> tuple:
    """The run of ``spec`` under ``config``: read from the JSON file ``path`` if it holds
    this very run (same :func:`run_key`), else trained and stored there by rank 0 (written
    to a temporary file and renamed, so an interrupted run leaves no partial file).
    Returns (result, whether it came from the file)."""
    key = run_key(spec, config)
    if path is not None and path.exists():
        stored = json.loads(path.read_text())
        if stored.get("key") == key:
            return RunResult.from_json(stored["run"]), True
    res = train(spec, config, name, progress)
    if path is not None and world()[0] == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, "run": res.to_json()}))
        tmp.replace(path)
    return res, False


def cached_baseline(spec: TrainSpec, cache_dir: Path | None, progress=True) -> tuple:
    """The native float32 run of ``spec``, cached in ``cache_dir`` (:func:`cached_run`).
    A data-parallel baseline is cached apart from the 1-process one (different rounding)."""
    size = world()[1]
    tag = f"-ddp{size}" if size > 1 else ""
    path = None if cache_dir is None else Path(cache_dir) / f"baseline-{spec.key()}{tag}.json"
    return cached_run(spec, None, "float32", path, progress)


# --- reporting -------------------------------------------------------------------------

def metric_names(spec: TrainSpec) -> tuple[str, str]:
    """(headline metric, its label): validation bpc for text, test accuracy otherwise."""
    return ("bpc", "val bits/char") if spec.data == "text" else ("acc", "test acc")


def _cells(r, first, base, key) -> tuple[str, str, str]:
    """A comparison row's metric, its change from the first run (points for accuracy) and
    its notes (diverged; compile time)."""
    val = r.final.get(key, float("nan"))
    shown = f"{100 * val:12.2f}%" if key == "acc" else f"{val:13.4f}"
    delta = "" if r is first or base is None else (
        f"{100 * (val - base):+7.2f} pts" if key == "acc" else f"{val - base:+8.4f}")
    note = " (diverged)" if r.diverged else ""
    if r.compile_seconds >= 0.05:
        note += f" (+{r.compile_seconds:.1f}s compiling kernels, once)"
    return shown, delta, note


def comparison_table(spec: TrainSpec, runs: list[RunResult]) -> str:
    """The final metrics of each run, and the change from the first (the baseline)."""
    key, label = metric_names(spec)
    head = f"{'run':8}  {'config':44}  {'train loss':>10}  {'test loss':>9}  {label:>13}  " \
           f"{'change':>11}  {'steps':>5}  {'time':>7}"
    lines = [head, "-" * len(head)]
    base = runs[0].final.get(key)
    for r in runs:
        f = r.final
        shown, delta, note = _cells(r, runs[0], base, key)
        lines.append(f"{r.name:8}  {r.config[:44]:44}  {f.get('train_loss', float('nan')):10.4f}"
                     f"  {f.get('loss', float('nan')):9.4f}  {shown}  {delta:>11}  "
                     f"{r.steps:5d}  {r.seconds:6.1f}s{note}")
    return "\n".join(lines)


def plot_runs(spec: TrainSpec, runs: list[RunResult], path: Path, title: str = ""):
    """Loss per step (smoothed) and the headline metric per epoch, one line per run."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    key, label = metric_names(spec)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in runs:
        loss = np.asarray(r.step_loss, np.float64)
        w = max(1, len(loss) // 50)
        smooth = np.convolve(loss, np.ones(w) / w, mode="valid") if len(loss) >= w else loss
        ax1.plot(np.arange(len(smooth)) + w, smooth, label=f"{r.name}: {r.config}")
        ax2.plot([e["epoch"] for e in r.evals],
                 [100 * e[key] if key == "acc" else e[key] for e in r.evals], marker="o",
                 label=r.name)
    ax1.set_xlabel("step")
    ax1.set_ylabel("training loss (label-smoothed CE)")
    ax1.legend(fontsize=7)
    ax2.set_xlabel("epoch")
    ax2.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax2.set_ylabel(label + (" (%)" if key == "acc" else ""))
    ax2.legend(fontsize=7)
    fig.suptitle(title or f"{spec.label()}: PAM vs float32")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def fmt_metric(key: str, run: RunResult) -> str:
    return _metric_text(key, run.final.get(key, float("nan")))


def _metric_text(key: str, v: float) -> str:
    return f"{100 * v:.2f}%" if key == "acc" else f"{v:.4f}"


def _epoch_metric(spec: TrainSpec, ev: dict) -> str:
    key, label = metric_names(spec)
    return f"{label} {_metric_text(key, ev[key])}"


def higher_is_better(key: str) -> bool:
    return key == "acc"


# --- multipliers side by side (pamsim train --mul a,b,c; pamsim study multipliers) ------

def run_name(mul) -> str:
    """A run's name in the tables: PAM and L-Mul as the papers write them, else the spelling."""
    return {"pam": "PAM", "lmul": "L-Mul"}.get(str(mul), str(mul))


def multiplier_facts(mul, fmt, acc) -> dict:
    """What a run's multiplier is, beside its quality: its error statistics at the operand
    format ``fmt`` (emu.multipliers.error_stats: mean = bias, max_abs = largest |error|)
    and its analytic MAC (costs.analytic.mac, ``acc`` accumulator) as a fraction of the
    float multiplier's MAC in ``fmt``.  ``mul`` None: the native float32 baseline, the
    exact product at float32 with a float32 MAC."""
    import emu
    from costs import analytic as A
    from emu.multipliers import error_stats
    if isinstance(fmt, emu.mx.MXFormat):        # a scaled format: its forward elements
        fmt = emu.recipe(fmt.mx)
    if isinstance(fmt, emu.Recipe):
        fmt = fmt.element("act")
    fmt_ = emu.float32 if mul is None else fmt
    m = emu.multiplier("exact" if mul is None else mul)
    st = error_stats(m, fmt_)
    mac = A.mac(fmt_, emu.float32 if mul is None else acc, m)
    energy, area = mac.ratio(A.mac(fmt, acc, "float"))
    return {"mul": "float32 (native)" if mul is None else str(m), "fmt": emu.format(fmt_).name,
            "mean_err": st.mean, "max_err": st.max_abs, "exhaustive": st.exhaustive,
            "mac_pj": mac.energy_pj, "mac_um2": mac.area_um2, "energy_ratio": energy,
            "area_ratio": area}


def multiplier_table(spec: TrainSpec, runs: list[RunResult], facts: list[dict]) -> str:
    """The final metric of each run (the first: the baseline) beside its multiplier's error
    statistics and cost per MAC (:func:`multiplier_facts`)."""
    key, label = metric_names(spec)
    float_fmt = next(f["fmt"] for f in facts[1:])
    head = (f"{'run':16}  {'fmt':9}  {label:>13}  {'change':>11}  {'mean err':>9}  "
            f"{'max |err|':>9}  {'MAC pJ':>7}  {'energy':>7}  {'area':>7}  {'steps':>5}  "
            f"{'time':>7}")
    lines = [head, "-" * len(head)]
    base = runs[0].final.get(key)
    for r, f in zip(runs, facts):
        shown, delta, note = _cells(r, runs[0], base, key)
        lines.append(f"{r.name[:16]:16}  {f['fmt'][:9]:9}  {shown}  {delta:>11}  "
                     f"{100 * f['mean_err']:8.3f}%  {100 * f['max_err']:8.3f}%  "
                     f"{f['mac_pj']:7.3f}  {100 * f['energy_ratio']:6.1f}%  "
                     f"{100 * f['area_ratio']:6.1f}%  {r.steps:5d}  {r.seconds:6.1f}s{note}")
    lines.append(f"err: relative error of one product over every pair of normal mantissas "
                 f"(sampled for float32); MAC: 45 nm analytic model (docs/costs.md), energy "
                 f"and area as % of the {float_fmt} float-multiplier MAC with the same "
                 f"accumulator")
    return "\n".join(lines)


def plot_multipliers(spec: TrainSpec, runs: list[RunResult], facts: list[dict], path: Path,
                     title: str = ""):
    """Training loss and the headline metric per epoch of every run, and each run's final
    metric against its multiplier's energy per MAC (% of the float multiplier's MAC)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    key, label = metric_names(spec)
    unit = " (%)" if key == "acc" else ""
    scale = 100 if key == "acc" else 1
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2))
    for i, r in enumerate(runs):
        colour = "k" if i == 0 else f"C{i - 1}"
        loss = np.asarray(r.step_loss, np.float64)
        w = max(1, len(loss) // 50)
        smooth = np.convolve(loss, np.ones(w) / w, mode="valid") if len(loss) >= w else loss
        ax1.plot(np.arange(len(smooth)) + w, smooth, color=colour, label=r.name)
        ax2.plot([e["epoch"] for e in r.evals], [scale * e[key] for e in r.evals], marker="o",
                 color=colour, label=r.name)
        f = facts[i]
        ax3.scatter([100 * f["energy_ratio"]], [scale * r.final.get(key, math.nan)],
                    color=colour, s=40)
        ax3.annotate(r.name, (100 * f["energy_ratio"], scale * r.final.get(key, math.nan)),
                     textcoords="offset points", xytext=(5, 4), fontsize=8)
    ax1.set_xlabel("step")
    ax1.set_ylabel("training loss (label-smoothed CE)")
    ax1.legend(fontsize=7)
    ax2.set_xlabel("epoch")
    ax2.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax2.set_ylabel(label + unit)
    ax2.legend(fontsize=7)
    ax3.set_xlabel(f"energy per MAC, % of the {facts[-1]['fmt']} float-multiplier MAC "
                   "(45 nm model)")
    ax3.set_ylabel(f"final {label}{unit}")
    fig.suptitle(title or f"{spec.label()}: multipliers vs float32")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
