"""The README's Python examples run as written (and so warm the set-up's cache:
sim/warm.py)."""
from sim.warm import README, readme_examples


def test_readme_python_examples_run():
    blocks = readme_examples()
    assert len(blocks) >= 2, "the README's ```python blocks were not found"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})
