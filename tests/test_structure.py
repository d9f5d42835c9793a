"""Layout rules: tests mirror the package, and the layers import only downwards.

- Every test file sits in `tests/<pkg>/` for a package `pivotrl/<pkg>/` (or in `tests/` for a
  top-level module `pivotrl/<module>.py`, or in the cross-cutting `tests/e2e/`, `tests/artifact/`),
  and every package has its test folder.
- No import cycles between the project's modules, counting deferred (function-level) imports too:
  a deferred import hides a cycle from Python, not from a reader.
- No module of the package is over `MAX_LINES` lines (issue 20: a longer one is split along its seams).
- The README's file map names every package and top-level module, and every file it names exists.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "pivotrl"
CROSS = {"e2e", "artifact"}
MAX_LINES = 500


def test_tests_mirror_the_package():
    packages = {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in PKG.glob("*.py") if p.stem not in ("__init__", "__main__")}
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and not p.name.startswith("__")}
    assert not packages - folders, f"packages without a test folder: {sorted(packages - folders)}"
    assert not folders - packages - CROSS, f"test folders with no package: {sorted(folders - packages - CROSS)}"
    for f in (ROOT / "tests").glob("test_*.py"):
        assert f.stem.removeprefix("test_") in modules | {"structure"}, f"{f.name}: no pivotrl/{f.stem[5:]}.py"


def test_no_module_is_over_the_line_limit():
    long = {str(p.relative_to(ROOT)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them along their seams): {long}"


def _module_imports(path: Path) -> set[str]:
    """Project modules `path` imports anywhere (`if TYPE_CHECKING:` blocks, which never run, aside)."""
    tree = ast.parse(path.read_text())
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)}
    out: set[str] = set()
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.ImportFrom) and n.module and n.level == 0 and n.module.startswith("pivotrl"):
            out.add(n.module)
        elif isinstance(n, ast.Import):
            out.update(a.name for a in n.names if a.name.startswith("pivotrl"))
    return out


def test_no_import_cycles():
    mods = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
            for p in PKG.rglob("*.py")}
    graph = {m: {i for i in _module_imports(p) if i in mods and i != m} for m, p in mods.items()}
    # a package's __init__ importing its own submodules is how packages expose names: not a cycle
    def edges(m: str) -> set[str]:
        return {i for i in graph[m] if not (i.startswith(m + ".") and mods[m].name == "__init__.py")}

    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for i in sorted(edges(m)):
            if state.get(i) == 1:
                cycles.append(" -> ".join(stack[stack.index(i):] + [i]))
            elif i not in state:
                visit(i)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_config_imports_no_layer_above_it():
    """`pivotrl/config` is the bottom layer (with `pivotrl.registry`): it knows the names other
    layers provide (lazy `module:attr` registry targets, e.g. `models.genrm.judge.parser` ->
    pivotrl/rl/genrm.py) and never imports them, deferred imports included."""
    def allowed(mod: str) -> bool:
        return mod in ("pivotrl.registry", "pivotrl.config") or mod.startswith("pivotrl.config.")

    for p in sorted((PKG / "config").glob("*.py")):
        bad = sorted(i for i in _module_imports(p) if not allowed(i))
        assert not bad, f"pivotrl/config/{p.name} imports {bad}"
    # the registry's own deferred import is the config's error type only
    assert _module_imports(PKG / "registry.py") <= {"pivotrl.config.base"}


def test_the_readme_file_map_is_true():
    """Each entry of README.md's file map (a path at the start of a line) exists, as does each file
    it names (`a/b.py` from the repository root, a bare `b.py` at the root or under the entry it
    describes), and every package and top-level module of `pivotrl/` has an entry."""
    block = (ROOT / "README.md").read_text().split("## File map", 1)[1].split("```")[1]
    entries, missing, here = set(), [], ROOT
    for line in block.splitlines():
        if line and not line[0].isspace():
            head = line.split()[0]
            entries.add(head.rstrip("/"))
            here = ROOT / head if head.endswith("/") else (ROOT / head).parent
            line = line[len(head):]
        for name in re.findall(r"[\w./-]*\w\.(?:py|sh|md|yaml)\b", line):
            if name.startswith("../"):
                continue  # outside the repository (the shared design documents)
            if not (ROOT / name).exists() and ("/" in name or not any(here.rglob(name))):
                missing.append(f"{name} (under {here.relative_to(ROOT)})")
    assert not missing, f"README.md's file map names files that do not exist: {missing}"
    gone = sorted(e for e in entries if not (ROOT / e).exists())
    assert not gone, f"README.md's file map has entries that do not exist: {gone}"
    packages = {f"pivotrl/{p.name}" for p in PKG.iterdir() if (p / "__init__.py").is_file()}
    modules = {f"pivotrl/{p.name}" for p in PKG.glob("*.py") if p.stem not in ("__init__", "__main__")}
    assert not (packages | modules) - entries, f"not in README.md's file map: {sorted((packages | modules) - entries)}"
