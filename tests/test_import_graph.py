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


def class_sizes(sources: dict[str, str]) -> dict[str, int]:
    """Lines per class of ``sources`` (module name -> text), a class with several bases of
    its own package counted together with them: mixins spread one object's state over
    files, so the object is as big as all of them."""
    own: dict[str, int] = {}
    bases: dict[str, list[str]] = {}
    # keyed by module and name: two modules may each have a class of one name (the asyncio
    # Consumer and the sync facade's), and neither may hide the other's size
    for module, text in sources.items():
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                key = f"{module}.{node.name}"
                own[key] = node.end_lineno - node.lineno + 1
                bases[key] = [b.id for b in node.bases if isinstance(b, ast.Name)]
    by_name: dict[str, list[str]] = {}
    for key in own:
        by_name.setdefault(key.rpartition(".")[2], []).append(key)

    def resolve(module: str, base: str) -> str | None:
        """A base named in ``module``: its own class of that name, else the one class of
        that name elsewhere (an import), else None (outside the sources, or ambiguous)."""
        if f"{module}.{base}" in own:
            return f"{module}.{base}"
        found = by_name.get(base, [])
        return found[0] if len(found) == 1 else None

    def size(key: str) -> int:
        module = key.rpartition(".")[0]
        mixins = [m for m in (resolve(module, b) for b in bases[key]) if m is not None]
        if len(mixins) < 2:
            return own[key]
        return own[key] + sum(size(m) for m in mixins)

    return {key: size(key) for key in own}


def test_class_size_counts_its_mixins() -> None:
    sources = {"m": "class A:\n    x = 1\n\nclass B:\n    y = 1\n    z = 2\n\n"
                    "class C(A, B):\n    pass\n\nclass D(A):\n    pass\n",
               "n": "import m\n\nclass E(C, Exception):\n    pass\n"}
    # mixed from A and B: 2 + 2 + 3; one base is ordinary inheritance, not a mixin
    assert class_sizes(sources) == {"m.A": 2, "m.B": 3, "m.C": 7, "m.D": 2, "n.E": 2}
    # one name in two modules: each class keeps its own size
    twins = {"a": "class Client:\n    x = 1\n", "b": "class Client:\n    pass\n\n\n"}
    assert class_sizes(twins) == {"a.Client": 2, "b.Client": 2}


def test_no_class_over_the_limit() -> None:
    sources = {name: path.read_text() for name, path in modules().items() if in_scope(name)}
    too_big = {name: n for name, n in class_sizes(sources).items() if n > MAX_CLASS_LINES}
    assert too_big == {}, f"classes over {MAX_CLASS_LINES} lines: {too_big}"


def test_no_class_declares_its_host_attributes_for_the_type_checker() -> None:
    """An ``if TYPE_CHECKING:`` block in a class body re-declares attributes that another
    class owns (a mixin's host): mypy never checks them against the owner."""
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    if isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test):
                        found.append(f"{name}.{node.name}")
    assert found == [], f"classes with TYPE_CHECKING blocks: {found}"
