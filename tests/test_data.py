"""The offline datasets and model loader."""
import numpy as np

from workloads import data


def test_digits_and_mnist_splits():
    d = data.digits(seed=1)
    assert d.x_train.dtype == np.float32 and d.x_train.shape[1] == 64
    assert len(d.x_train) + len(d.x_test) == 1797 and 0 <= d.x_train.min() <= d.x_train.max() <= 1
    assert np.array_equal(data.digits(seed=1).y_test, d.y_test)
    m = data.mnist()
    assert m.x_train.shape == (4000, 784) and m.image_shape == (28, 28)
    assert set(np.unique(m.y_train)) == set(range(10))


def test_kjv_characters():
    c = data.kjv_chars(max_chars=100_000)
    assert c.decode(c.train[:17]) == "In the beginning "
    assert len(c.train) + len(c.val) == 100_000
    assert c.encode("God") .tolist() == [c.vocab.index(ch) for ch in "God"]
    assert "1:1" not in data.kjv_text()[:100]
