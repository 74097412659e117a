"""The structure's rules: no import circle among the Python modules of ``python/hostfeed``
nor among the Rust files of each crate (read from their ``import``/``use`` lines), no
Python module over :data:`MAX_PYTHON_LINES` lines, no Python class over
:data:`MAX_CLASS_LINES` (its ``class`` line to its last, docstrings included), and no Rust
file over :data:`MAX_RUST_LINES`.

    python .ci/structure_check.py          # exit 1, naming each circle or long module
    python .ci/structure_check.py --graph  # also print every module's imports

Python: every ``import``/``from ... import`` of a hostfeed module, at any depth of the file
(a function's deferred import counts too: it is still a dependency), except under
``if TYPE_CHECKING:``; ``from . import x`` names the module ``x`` where it is one.
Rust: every ``use crate::...``, ``use super::...`` and ``use self::...`` path (groups in
braces expanded), resolved to the file that defines the module it names (``a/b.rs`` or
``a/b/mod.rs``); ``mod x;`` declarations and ``#[cfg(test)]`` test modules (files named
``tests.rs`` or ``loom_models.rs``, and items after ``#[cfg(test)]`` ``mod tests``) are
not uses. A file's own submodules (``use self::x`` from ``x``'s parent) are uses.
"""
from __future__ import annotations

import argparse
import ast
import pathlib
import re
import sys
from collections.abc import Iterable

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "python" / "hostfeed"
CRATES = [ROOT / "crates" / "hostfeed-core" / "src", ROOT / "bindings" / "python" / "src"]
#: The longest a Python module may be: a longer one holds more than one concern.
MAX_PYTHON_LINES = 620
#: The longest a Python class may be: a longer one holds more than one concern (split it
#: into parts it composes, or bases that each hold one).
MAX_CLASS_LINES = 250
#: The longest a Rust file may be (tests included: a file's tests go to a `tests.rs` of its
#: own when they outgrow it).
MAX_RUST_LINES = 800


# ---- Python ------------------------------------------------------------------------------
def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            stack.append(child)


def python_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = name.split(".")
                    base = base[:len(base) - node.level + (1 if is_package else 0)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                targets = [module] + [f"{module}.{a.name}" for a in node.names]
            for named in targets:
                # The deepest hostfeed module the import names (a module, or the module
                # that defines the name).
                target = named
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def long_classes(path: pathlib.Path) -> list[tuple[str, int]]:
    """The classes of ``path`` (at any depth) over :data:`MAX_CLASS_LINES` lines: (qualified
    name, lines).

    Example:
        >>> import tempfile
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "m.py"
        >>> _ = f.write_text("class A:\n" + "    x = 1\n" * MAX_CLASS_LINES)
        >>> long_classes(f)
        [('A', 251)]
    """
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                name = prefix + child.name
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                if lines > MAX_CLASS_LINES:
                    out.append((name, lines))
                visit(child, name + ".")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, prefix + child.name + ".")
    visit(ast.parse(path.read_text(), str(path)), "")
    return out


# ---- Rust --------------------------------------------------------------------------------
_USE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", re.M)
_TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", re.M)


def _expand(tree: str) -> list[str]:
    """``a::{b, c::{d, e}}`` -> ``a::b``, ``a::c::d``, ``a::c::e``."""
    tree = re.sub(r"\s+", "", tree)
    if "{" not in tree:
        return [tree.split(" as ")[0]]
    head, _, rest = tree.partition("{")
    inner = rest[:-1]
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(inner):
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    return [head + p2 for p in parts if p for p2 in _expand(p)]


def _rust_module(src: pathlib.Path, path: pathlib.Path) -> tuple[str, ...]:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] in ("mod", "lib", "main"):
        parts.pop()
    return tuple(parts)


def rust_graph(src: pathlib.Path) -> dict[str, set[str]]:
    files = {_rust_module(src, p): p for p in src.rglob("*.rs")
             if p.name not in ("tests.rs", "loom_models.rs")}
    graph: dict[str, set[str]] = {str(p.relative_to(ROOT)): set() for p in files.values()}
    for module, path in files.items():
        text = path.read_text()
        test = _TEST_MOD.search(text)
        if test:
            text = text[:test.start()]
        for m in _USE.finditer(text):
            for use in _expand(m.group(1)):
                segs = use.split("::")
                if segs[0] == "crate":
                    target = list(segs[1:])
                elif segs[0] == "super":
                    base = list(module)
                    while segs and segs[0] == "super":
                        base = base[:-1]
                        segs = segs[1:]
                    target = base + segs
                elif segs[0] == "self":
                    target = list(module) + segs[1:]
                else:
                    continue
                while target and tuple(target) not in files:
                    target.pop()
                dest = files.get(tuple(target))
                if dest is not None and dest != path:
                    graph[str(path.relative_to(ROOT))].add(str(dest.relative_to(ROOT)))
    return graph


# ---- circles -----------------------------------------------------------------------------
def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), sorted.

    Example:
        >>> circles({"a": {"b"}, "b": {"a", "c"}, "c": set()})
        [['a', 'b']]
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--graph", action="store_true", help="print every module's imports")
    args = parser.parse_args(argv)
    graphs = {"python/hostfeed": python_graph()}
    graphs.update({str(src.relative_to(ROOT)): rust_graph(src) for src in CRATES})
    found = 0
    for where, graph in graphs.items():
        if args.graph:
            for name in sorted(graph):
                print(f"{name} -> {', '.join(sorted(graph[name])) or '-'}")
        for circle in circles(graph):
            found += 1
            ties = [f"{a} -> {b}" for a in circle for b in sorted(graph[a]) if b in circle]
            print(f"import circle in {where}: {', '.join(circle)}\n  " + "\n  ".join(ties),
                  file=sys.stderr)
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = len(path.read_text().splitlines())
        if lines > MAX_PYTHON_LINES:
            found += 1
            print(f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_PYTHON_LINES}): "
                  "split it by concern", file=sys.stderr)
        for name, lines in long_classes(path):
            found += 1
            print(f"{path.relative_to(ROOT)}: class {name} has {lines} lines (at most "
                  f"{MAX_CLASS_LINES}): split it by concern", file=sys.stderr)
    for src in CRATES:
        for path in sorted(src.rglob("*.rs")):
            lines = len(path.read_text().splitlines())
            if lines > MAX_RUST_LINES:
                found += 1
                print(f"{path.relative_to(ROOT)} has {lines} lines (at most {MAX_RUST_LINES}): "
                      "split it by concern", file=sys.stderr)
    if not found:
        print(f"no import circle ({sum(len(g) for g in graphs.values())} modules), no Python "
              f"module over {MAX_PYTHON_LINES} lines nor class over {MAX_CLASS_LINES}, no "
              f"Rust file over {MAX_RUST_LINES}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
