"""The package's own imports form no circle: every module imports the modules below it, at module level or inside a
function alike (an import inside a function that exists to break a circle hides the circle, it does not remove it).

The graph is read from the source with ``ast`` (no module is imported): ``gh200rt/`` and the top-level folders that
setup.py installs under the ``gh200rt`` namespace (``MAPPED_FOLDERS``). An edge is an ``import`` or ``from ... import``
written in the code, outside ``if TYPE_CHECKING:``; importing ``a.b.c`` also runs ``a/__init__`` and ``a/b/__init__``,
which are not edges here (a package's ``__init__`` re-exporting its modules is not a circle of the code).

No module imports another's private (``_name``) names. A circle fails with its modules.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def mapped_folders(root: Path) -> tuple[str, ...]:
    """setup.py's ``MAPPED_FOLDERS``, read without running setup.py."""
    for node in ast.parse((root / "setup.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "MAPPED_FOLDERS" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("setup.py defines no MAPPED_FOLDERS")


def package_modules(root: Path, folders: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> source file, for ``gh200rt/`` and each mapped folder (``kernels/x.py`` is
    ``gh200rt.kernels.x``)."""
    homes = {"gh200rt": root / "gh200rt", **{f"gh200rt.{folder}": root / folder for folder in folders}}
    found = {}
    for prefix, home in homes.items():
        for path in home.rglob("*.py"):
            parts = list(path.relative_to(home).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([prefix, *parts])] = path
    return found


class _Imports(ast.NodeVisitor):
    """The module names one file's import statements name (``from pkg import name`` names ``pkg.name`` where that is
    a module, else ``pkg``), outside ``if TYPE_CHECKING:`` blocks."""

    def __init__(self, name: str, is_package: bool, known: set[str]):
        self.package = name if is_package else name.rpartition(".")[0]
        self.known, self.names, self.private = known, set(), []

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            package = self.package.split(".")
            package = package[:len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        for alias in node.names:
            full = f"{base}.{alias.name}"
            self._add(full if full in self.known else base)
            if alias.name.startswith("_") and not alias.name.startswith("__") and full not in self.known \
                    and base in self.known:
                self.private.append(f"{full} (line {node.lineno})")

    def _add(self, name: str) -> None:
        while name and name not in self.known:
            name = name.rpartition(".")[0]
        if name:
            self.names.add(name)


def read_imports(root: Path = ROOT) -> dict[str, _Imports]:
    """Module -> what its import statements name."""
    modules = package_modules(root, mapped_folders(root))
    known = set(modules)
    found = {}
    for name, path in modules.items():
        visitor = _Imports(name, path.name == "__init__.py", known)
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        found[name] = visitor
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package modules it imports (anywhere in the file)."""
    return {name: imports.names - {name} for name, imports in read_imports(root).items()}


def circles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_imports_form_no_circle():
    found = circles(import_graph())
    assert not found, f"import circles (an import inside a function counts): {sorted(sorted(c) for c in found)}"


def test_no_module_imports_another_modules_private_names():
    """A name another module imports is part of its interface: it has a public name."""
    private = {name: imports.private for name, imports in read_imports().items() if imports.private}
    assert not private, f"private names imported from other modules: {private}"


def test_the_reader_sees_imports_of_every_kind(tmp_path):
    """A circle closed by an import inside a function is found; one through TYPE_CHECKING is not; relative imports
    and a mapped folder resolve."""
    (tmp_path / "setup.py").write_text('MAPPED_FOLDERS = ("kernels",)\n')
    pkg, kernels = tmp_path / "gh200rt", tmp_path / "kernels"
    (pkg / "sub").mkdir(parents=True)
    kernels.mkdir()
    for init in (pkg / "__init__.py", pkg / "sub" / "__init__.py", kernels / "__init__.py"):
        init.write_text("")
    (pkg / "sub" / "a.py").write_text("from . import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from gh200rt.kernels.k import g\n")
    (kernels / "k.py").write_text("from ..sub.a import x\nfrom typing import TYPE_CHECKING\n"
                                  "if TYPE_CHECKING:\n    from .t import T\n")
    (kernels / "t.py").write_text("from .k import g, _hidden, __doc__\n")
    graph = import_graph(tmp_path)
    assert read_imports(tmp_path)["gh200rt.kernels.t"].private == ["gh200rt.kernels.k._hidden (line 1)"]
    assert graph["gh200rt.kernels.k"] == {"gh200rt.sub.a"}
    assert circles(graph) == {frozenset({"gh200rt.sub.a", "gh200rt.sub.b", "gh200rt.kernels.k"})}
