"""The packages form layers: no module imports a package above its own (issue 13).

emu is the base; rtl, torch_bridge and workloads (training models and data) sit on
it; costs may use those; sim (CLI, simulations, benches) may use everything.
Imports inside functions count too."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: package -> the pamsim packages it may import
ALLOWED = {
    "emu": set(),
    "workloads": set(),
    "rtl": {"emu"},
    "torch_bridge": {"emu"},
    "costs": {"emu", "rtl", "workloads"},
    "sim": {"emu", "rtl", "torch_bridge", "workloads", "costs"},
}


def _imported_packages(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & set(ALLOWED)


@pytest.mark.parametrize("package", list(ALLOWED))
def test_no_import_from_a_higher_layer(package):
    bad = {str(p.relative_to(ROOT)): sorted(_imported_packages(p) - ALLOWED[package] - {package})
           for p in sorted((ROOT / package).rglob("*.py"))}
    assert not {k: v for k, v in bad.items() if v}


def test_every_package_is_layered():
    import tomllib
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    assert {p.rstrip("*") for p in found} == set(ALLOWED)
