"""The packages form layers, their files no import circles, and their private parts
stay private (issues 13 and 28).

emu is the base; rtl, torch_bridge and workloads (training models and data) sit on
it; costs may use those; sim (CLI, simulations, benches) may use everything.  Read on
the source text, so imports inside functions count too: a lazy import cannot hide a
circle."""
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


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


#: every module of the pamsim packages: dotted name -> file
MODULES = {_module_name(p): p for package in ALLOWED
           for p in sorted((ROOT / package).rglob("*.py"))}


def _imports(path: Path):
    """``(module, names)`` per import statement of ``path``, anywhere in it: the
    absolute module imported from (relative imports resolved) and the names taken from
    it (``()`` for ``import module``)."""
    here = _module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[:len(base) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            yield module, tuple(a.name for a in node.names)


def _imported_packages(path: Path) -> set[str]:
    return {module.split(".")[0] for module, _ in _imports(path)} & set(ALLOWED)


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


# --- import circles ---------------------------------------------------------------

def _targets(path: Path) -> set[str]:
    """The pamsim modules ``path`` imports: ``from pkg import module`` is the module's
    file, ``from pkg.mod import name`` pkg/mod.py, ``import a.b`` a/b.py.  A package's
    __init__ counts only where it is named itself (importing a submodule runs it, but
    that is no dependency of the importer on what __init__ defines)."""
    found = set()
    for module, names in _imports(path):
        subs = {f"{module}.{n}" for n in names} & set(MODULES)
        found |= subs
        if module in MODULES and (not names or len(subs) < len(names)):
            found.add(module)
    return found


def _cycle(graph: dict) -> list:
    """One circle of ``graph`` (node -> set of nodes) as a list of nodes, or []."""
    state = {}                      # node -> "open" while on the path, "done" after

    def visit(node, path):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, path)
                if found:
                    return found
        state[node] = "done"
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return []


@pytest.mark.parametrize("package", list(ALLOWED))
def test_no_import_circle(package):
    mods = {m: p for m, p in MODULES.items() if m.split(".")[0] == package}
    graph = {m: _targets(p) & set(mods) for m, p in mods.items()}
    cycle = _cycle(graph)
    assert not cycle, "import circle: " + " -> ".join(
        str(mods[m].relative_to(ROOT)) for m in cycle)


def test_the_circle_finder_sees_lazy_and_relative_imports(tmp_path):
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) == []
    # emu/grad.py's ``from .ops import backend_for`` (or its successor) is an edge
    grad = _targets(ROOT / "emu" / "grad.py")
    assert "emu.formats" in grad and "emu" not in grad


# --- private names --------------------------------------------------------------

def _private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def _private_uses(path: Path, package: str) -> list[str]:
    """What ``path`` takes from another pamsim package that is private there: a module
    or name starting with ``_`` in an import, or an attribute starting with ``_`` read
    from a name bound by such an import (``emu._kernels``, ``E._ROUNDING_ALIASES``)."""
    bad, foreign = [], set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in set(ALLOWED) - {package}:
                    if any(map(_private, alias.name.split("."))):
                        bad.append(f"import {alias.name}")
                    foreign.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in set(ALLOWED) - {package}:
            names = [a.name for a in node.names]
            if any(map(_private, node.module.split("."))) or any(map(_private, names)):
                bad.append(f"from {node.module} import {', '.join(names)}")
            foreign |= {a.asname or a.name for a in node.names}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in foreign:
                bad.append(f"{ast.unparse(node)} (line {node.lineno})")
    return bad


@pytest.mark.parametrize("package", list(ALLOWED))
def test_no_private_name_of_another_package(package):
    bad = {str(p.relative_to(ROOT)): _private_uses(p, package)
           for p in sorted((ROOT / package).rglob("*.py"))}
    assert not {k: v for k, v in bad.items() if v}


def test_the_private_check_sees_attributes(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import emu\nfrom emu import ops as E\nfrom emu.lowlevel import scalar\n"
                   "def f():\n    return emu._kernels.X, E._ROUNDING_ALIASES, emu.__file__\n")
    assert sorted(_private_uses(src, "sim")) == ["E._ROUNDING_ALIASES (line 5)",
                                                 "emu._kernels (line 5)"]
    src.write_text("from emu._scalar_approx import ln2_pattern\nfrom emu.ops import _x\n")
    assert len(_private_uses(src, "sim")) == 2
