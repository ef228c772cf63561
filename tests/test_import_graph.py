"""The shape of the package (issue 12): the import graph of ``smartnsq/`` has no cycles, and
outside the embedded test double (and the demo scripts) no module is over 500 lines and no
class over 400.

Every import statement counts, also those under ``TYPE_CHECKING`` and inside functions: each
is an arrow a reader has to follow. ``from a.b import c`` points at the module ``a.b.c`` when
there is one, else at ``a.b``; a parent package's ``__init__`` is not implied."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "smartnsq"

MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 400
#: module prefixes the size limits do not apply to, and why
EXEMPT: dict[str, str] = {
    "smartnsq.devcluster": "the embedded test double (issue 12 asks only for its cycles)",
    "smartnsq.demo": "demo scripts (make demo, the Spark demo): self-contained, not library code",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports_of(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                if node.level > 1:
                    base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("smartnsq"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    yield sub
                elif target in known:
                    yield target


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: set(imports_of(name, path, known)) - {name}
            for name, path in known.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(g):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(g.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                comp: list[str] = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def in_scope(name: str) -> bool:
    return not any(name.startswith(prefix) for prefix in EXEMPT)


def test_the_graph_sees_the_package() -> None:
    g = graph()
    # a sanity check of the walk itself: known arrows are found
    assert "smartnsq.conn.handshake" in g["smartnsq.conn.connecting"]
    assert "smartnsq.consumer.dispatch" in g["smartnsq.consumer.consumer"]
    assert "smartnsq.consumer.consumer" in g["smartnsq.ordered.consumer"]


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles() -> None:
    found = cycles(graph())
    assert found == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_module_over_the_limit() -> None:
    too_big = {}
    for name, path in modules().items():
        n = len(path.read_text().splitlines())
        if in_scope(name) and n > MAX_MODULE_LINES:
            too_big[name] = n
    assert too_big == {}, f"modules over {MAX_MODULE_LINES} lines: {too_big}"


def test_no_class_over_the_limit() -> None:
    too_big = {}
    for name, path in modules().items():
        if not in_scope(name):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                n = node.end_lineno - node.lineno + 1
                if n > MAX_CLASS_LINES:
                    too_big[f"{name}.{node.name}"] = n
    assert too_big == {}, f"classes over {MAX_CLASS_LINES} lines: {too_big}"
