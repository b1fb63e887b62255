"""The package layout carries the architecture (docs/ARCHITECTURE.md, "Layers"): core/ at the
ground floor, data/ and worker/ above it, the run service (control/) above data/, the front-ends
on top; no import climbs (LAYERS, checked by package on every import statement, also those inside
functions, and on the module names given to importlib). The control plane (and every front-end
that runs on a login node) never imports torch, transformers or the worker, and of the data
package only the torch-free modules named in DATA_TORCH_FREE, which themselves import nothing
heavy; checked statically and at run time for the commands people type."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from clusterfsdp.data import TORCH_FREE

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "safetensors", "datasets", "tokenizers", "numpy", "pandas")
# clusterfsdp/data/: what the control plane may import (validate and submit check data with it);
# the one list, in the package itself (docs/ARCHITECTURE.md shows it: test_architecture_lists_them)
DATA_TORCH_FREE = TORCH_FREE
DATA_DIR = REPO / "clusterfsdp" / "data"
DATA_HEAVY = tuple(
    f"clusterfsdp.data.{p.stem}" for p in sorted(DATA_DIR.glob("*.py")) if p.stem not in (*DATA_TORCH_FREE, "__init__")
)


def module_file(name: str) -> Path:
    """clusterfsdp.a.b -> <repo>/clusterfsdp/a/b.py (the tui package lives at <repo>/tui)."""
    parts = name.split(".")
    return REPO.joinpath(*(parts[1:] if parts[1:2] == ["tui"] else parts)).with_suffix(".py")


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, relative ones resolved."""
    parts = list(path.relative_to(REPO).parts[:-1])
    package = ".".join(["clusterfsdp", *parts] if parts[:1] == ["tui"] else parts)
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for a in node.names:  # `from pkg import mod` imports pkg.mod too
                sub = f"{base}.{a.name}"
                is_module = (REPO / Path(*sub.split(".")[1:])).is_dir() or module_file(sub).is_file()
                out += [(node.lineno, base)] * bool(node.module) + [(node.lineno, sub)] * (is_module or not node.module)
    return out


def importlib_names(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every `importlib.import_module("clusterfsdp....")` in a file: an import too."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            out += [
                (node.lineno, a.value) for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
            ]
    return out


# The floors, lowest first: a module may import its own package and any floor below its own.
LAYERS = {"core": 0, "data": 1, "worker": 2, "control": 2, "front": 3}
# What the run service names for submitit to import in the job's own process (the pickled call of
# an attempt, the reference pass, a prepare-array task): entry points, not imports of the service.
ENTRY_POINTS = {
    "clusterfsdp.worker.main",
    "clusterfsdp.worker.reference",
    "clusterfsdp.data.array",
    "clusterfsdp.data.prepare",
}


def floor(module: str) -> str:
    """The floor of a product module: its subpackage, or `front` (cli, tui, notebook, the rest)."""
    sub = module.split(".")[1] if module.count(".") >= 1 else ""
    return sub if sub in ("core", "data", "worker", "control") else "front"


def climbs(path: Path) -> list[str]:
    """The imports of `path` that reach a floor above its own, or sideways between worker/ and
    control/ (the worker calls the run service as a process: `python -m clusterfsdp.control...`)."""
    rel = path.relative_to(REPO)
    own = floor(".".join(("clusterfsdp", *rel.parts[1:])) if rel.parts[0] == "clusterfsdp" else "clusterfsdp.tui.x")
    out = []
    for line, name in imports(path) + importlib_names(path):
        if not name.startswith("clusterfsdp.") or (own == "control" and name in ENTRY_POINTS):
            continue
        there = floor(name)
        if there != own and (LAYERS[there] > LAYERS[own] or LAYERS[there] == LAYERS[own]):
            out.append(f"{rel}:{line} ({own}) imports {name} ({there})")
    return out


def test_no_import_climbs_a_floor():
    """core/ imports only core/; data/ core/; worker/ core/ and data/; control/ core/ and data/
    (the worker's entry points by name only, for submitit); the front-ends anything below."""
    product = [p for p in files("clusterfsdp") if "tui" not in p.relative_to(REPO).parts]
    assert not [c for p in product for c in climbs(p)]


def files(*roots: str) -> list[Path]:
    return sorted(p for r in roots for p in (REPO / r).rglob("*.py")) if roots else []


def offending(paths: list[Path], banned: tuple[str, ...]) -> list[str]:
    return [
        f"{p.relative_to(REPO)}:{line} imports {name}"
        for p in paths
        for line, name in imports(p)
        if any(name == b or name.startswith(b + ".") for b in banned)
    ]


def test_control_plane_never_imports_torch_or_the_worker():
    banned = (*HEAVY, "clusterfsdp.worker", "clusterfsdp.notebook", *DATA_HEAVY)
    assert not offending(files("clusterfsdp/control"), banned)


# A kind of source reads its rows with its own package, imported in the method prepare calls
# (never on validate's path: a kind's `sniff` reads the folder's JSON): the one heavy import a
# torch-free data module may hold.
READS_WITH = {"clusterfsdp/data/hfdatasets.py": "datasets"}


def test_the_torch_free_data_modules_import_nothing_heavy():
    """They are what validate and submit use; the numpy half imports them, never the reverse."""
    torch_free = [DATA_DIR / f"{name}.py" for name in (*DATA_TORCH_FREE, "__init__")]
    assert all(p.is_file() for p in torch_free)
    assert DATA_HEAVY, "the numpy half of clusterfsdp/data is missing"
    banned = (*HEAVY, "clusterfsdp.worker", "clusterfsdp.notebook", *DATA_HEAVY)
    allowed = [f"{path}:{line} imports {name}" for path, name in READS_WITH.items() for line, got in
               imports(REPO / path) if got == name and line not in _module_level_lines(REPO / path)]  # fmt: skip
    assert len(allowed) == len(READS_WITH), allowed  # each allowance is real, and inside a function
    assert [o for o in offending(torch_free, banned) if o not in allowed] == []


def _module_level_lines(path: Path) -> set[int]:
    """The lines of a file's import statements that run when it is imported (not in a function)."""
    tree = ast.parse(path.read_text(), str(path))
    return {node.lineno for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))}


def test_front_ends_never_import_torch_and_the_tui_never_imports_the_cli():
    front = [*files("clusterfsdp/cli"), REPO / "clusterfsdp" / "__init__.py", *files("tui")]
    assert not offending(front, (*HEAVY, *DATA_HEAVY))
    assert not offending(files("tui"), ("clusterfsdp.cli",))


@pytest.mark.parametrize("package", ["core", "control", "data", "data.checks", "worker", "notebook"])
def test_importing_a_package_is_cheap(package):
    """Importing any subpackage (what submitit's unpickling and `python -m` do first) loads no torch."""
    code = f"import sys, clusterfsdp.{package}; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stdout + r.stderr


def test_architecture_lists_the_torch_free_modules():
    """docs/ARCHITECTURE.md's list of the torch-free data modules is data.TORCH_FREE, as generated."""
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    start, end = "<!-- torch-free data modules: data.TORCH_FREE -->\n", "\n<!-- /torch-free -->"
    block = text.split(start, 1)[1].split(end, 1)[0]
    assert block == ", ".join(f"`{name}`" for name in TORCH_FREE), block


def _runtime_imports(path: Path) -> set[str]:
    """The product modules a file imports when it runs: every import statement (also inside
    functions) and importlib name, but not those under `if TYPE_CHECKING:` (annotations only)."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {
        node.lineno
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for node in ast.walk(stmt)
        if isinstance(node, (ast.Import, ast.ImportFrom))
    }
    found = [name for line, name in imports(path) + importlib_names(path) if line not in typing_only]
    return {name for name in found if name.startswith("clusterfsdp.")}


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = ["clusterfsdp", *rel.parts] if rel.parts[0] == "tui" else list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_runtime_import_cycle():
    """No runtime import cycle among product modules (issue 35), function-level imports and
    importlib names counted. (Module names in plain strings, what warm start preloads and the
    controller it runs, are not imports: `python -m`-like process boundaries.)"""
    paths = [p for p in files("clusterfsdp", "tui") if "tui" not in p.relative_to(REPO).parts[1:2]]
    modules = {_module_name(p): p for p in paths}
    graph = {m: {n for n in _runtime_imports(p) if n in modules and n != m} for m, p in modules.items()}
    reach: dict[str, set[str]] = {}
    for start in graph:  # what each module reaches (a few hundred modules: a walk each)
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        reach[start] = seen
    cycles = {frozenset(m for m in graph if m in reach[start] and start in reach[m]) for start in graph}
    assert sorted(sorted(c) for c in cycles if len(c) > 1) == []


# The one name shared on purpose: worker/warmctl.Controller is core/localctl.Controller warmed up
# (a subclass, imports done once in the job's controller process).
SHARED_CLASS_NAMES_STATED = {"Controller"}


def _product_files() -> list[Path]:
    """clusterfsdp/ and tui/ (once: clusterfsdp/tui links to it), `__init__`/`__main__` aside."""
    return [
        p
        for p in files("clusterfsdp", "tui")
        if "tui" not in p.relative_to(REPO).parts[1:2] and p.name not in ("__init__.py", "__main__.py")
    ]


def _shared(names: dict[str, list[str]]) -> dict[str, list[str]]:
    return {name: sorted(where) for name, where in names.items() if len(where) > 1}


def shared_module_names() -> dict[str, list[str]]:
    """Module basenames of more than one product module, with their paths."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for p in _product_files():
        by_name[p.name].append(str(p.relative_to(REPO)))
    return _shared(by_name)


def shared_class_names() -> dict[str, list[str]]:
    """Module-level class names defined in more than one product module, with their modules."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for p in _product_files():
        for node in ast.parse(p.read_text(), str(p)).body:
            if isinstance(node, ast.ClassDef):
                by_name[node.name].append(str(p.relative_to(REPO)))
    return _shared(by_name)


def test_module_and_class_names_are_distinct():
    """Issue 35: one name, one thing. No two product modules share a basename (two `x.py` read
    as one module in a traceback, a grep or a doc), and no two product classes share a name (an
    import of the wrong one of two same-named classes reads right and may even type-check)."""
    modules = shared_module_names()
    classes = {n: w for n, w in shared_class_names().items() if n not in SHARED_CLASS_NAMES_STATED}
    assert (modules, classes) == ({}, {})


def test_the_allowances_are_real():
    """Each name the test above lets pass is still shared: a pair renamed leaves the list with it."""
    assert not SHARED_CLASS_NAMES_STATED - set(shared_class_names())
