"""The import layers of issue 11, read from the source with ``ast`` (every ``import``, including those inside
functions; not those under ``if TYPE_CHECKING:``):

1. leaves (``LEAVES``: errors, the metric catalogue, curves, the store URI, history, overrides, provenance)
   import nothing of ``harness`` or ``analysis`` but other leaves;
2. the core (the rest of ``harness`` but ``harness.launch`` and the entry points ``harness.sweep``,
   ``harness.tune``, ``harness.status``) never imports ``analysis`` or launch;
3. ``analysis`` imports of ``harness`` only the leaves and the registries (``REGISTRIES``), never launch;
4. launch, on top, may import anything.

And no cycles among the modules of ``harness`` and ``analysis`` (a module importing its own package's
``__init__``, to register itself there, is not one).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("harness", "analysis")
LEAVES = ("harness.errors", "harness.metrics", "harness.curves", "harness.collapse", "harness.uri", "harness.history",
          "harness.overrides", "harness.provenance", "harness.http_store")
REGISTRIES = ("harness.estimators", "harness.tasks", "harness.backends")
TOP = ("harness.launch", "harness.sweep", "harness.tune", "harness.status")


# ------------------------------------------------------------------------------------- the graph
def modules(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """``dotted name -> file`` of every module under ``root/<package>`` (a package is its ``__init__``)."""
    out = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST):
    """Every Import/ImportFrom node, skipping the bodies of ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                stack.extend(child.orelse)
            else:
                stack.append(child)


def _owner(name: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a project module (``harness.spec.build`` -> ``harness.spec``)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in known:
            return ".".join(parts[:i])
    return None


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``module`` imports."""
    out = set()
    is_pkg = path.name == "__init__.py"
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level-1 more
                pkg = module.split(".") if is_pkg else module.split(".")[:-1]
                pkg = pkg[:len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        out |= {t for t in map(lambda n: _owner(n, known), targets) if t is not None and t != module}
    return out


def graph(root: Path = ROOT, packages=PACKAGES) -> dict[str, set[str]]:
    known = modules(root, packages)
    return {m: imports(m, p, known) for m, p in known.items()}


def _registration(src: str, dst: str) -> bool:
    """``src`` imports its own (ancestor) package's ``__init__``: registering itself there."""
    return src.startswith(dst + ".")


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (``[a, b, ..., a]``) or None (depth-first search, registration edges left out)."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(g.get(m, ())):
            if _registration(m, n) or n not in g:
                continue
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(g):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def _under(module: str, prefixes) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def layer_violations(g: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, dsts in sorted(g.items()):
        for dst in sorted(dsts):
            if _under(src, LEAVES) and not _under(dst, LEAVES):
                bad.append(f"leaf {src} imports {dst}")
            elif src.startswith("harness") and dst.startswith("analysis"):  # issue 43: not even the entry points
                bad.append(f"harness {src} imports {dst} (analysis sits above harness)")
            elif src.startswith("harness") and not _under(src, TOP) and _under(dst, TOP):
                bad.append(f"core {src} imports {dst}")
            elif src.startswith("analysis") and dst.startswith("harness") and not _under(dst, LEAVES + REGISTRIES):
                bad.append(f"analysis {src} imports {dst} (only the leaves and the registries)")
    return bad


# ------------------------------------------------------------------------------------- the tests
def test_the_graph_sees_the_project():
    g = graph()
    assert {"harness.spec.schema", "harness.launch.sweep", "analysis.measures", "harness.backends"} <= set(g)
    assert "harness.backends" in g["harness.run"]  # a module-level import
    assert "harness.backends.local.run" in g["harness.backends.local"]  # an import inside a function


def test_the_spec_imports_no_backend():
    """``harness.spec`` imports the backend registry (a backend contributes its section and identity markers there),
    never a backend's own modules (issue 32)."""
    g = graph()
    bad = sorted(f"{src} imports {dst}" for src, dsts in g.items() if _under(src, ("harness.spec",))
                 for dst in dsts if dst.startswith("harness.backends."))
    assert not bad, "\n".join(bad)
    assert "harness.backends" in g["harness.spec.schema"]


def test_loading_the_spec_loads_no_backend_package():
    """At run time too (issue 43): the registry declares the sections backends add to the spec by module, so
    ``import harness.spec`` leaves every backend package (``harness.backends.local``, ``.verl``) unloaded; the
    static check above cannot see ``importlib`` (it used to load 4 backend modules this way)."""
    import subprocess
    import sys

    from harness import backends

    code = ("import sys, harness.spec; from harness import backends; print(sorted(m for m in sys.modules for p in "
            "backends._PACKAGES.values() if m == p or m.startswith(p + '.')))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout
    for name, section, cls in backends.sections():  # what the registry says is what each backend declares
        assert backends.get(name).section == (section, cls)
    assert [s for _, s, _ in backends.sections()] == ["verl"]


def test_no_circle_in_the_launch_layer_even_under_type_checking(monkeypatch):
    """Issue 43: ``launch/tune/spec.py`` and ``study.py`` imported each other (study's side type-only); the sampler
    and pruner now sit below both (``tune/algorithms.py``). Checked with the ``TYPE_CHECKING`` imports counted."""
    monkeypatch.setitem(globals(), "_is_type_checking", lambda test: False)  # count the type-only imports
    g = {m: d for m, d in graph().items() if _under(m, ("harness.launch",))}
    assert find_cycle(g) is None, find_cycle(g)


def test_layers():
    bad = layer_violations(graph())
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checks_catch_what_they_look_for(tmp_path):
    """A cycle through a function-level import is found; one closed only under TYPE_CHECKING, or by a module
    registering itself in its package, is not; a leaf importing the core is a violation."""
    pkg = tmp_path / "harness"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "uri.py").write_text("def f():\n    from harness import config\n")
    (pkg / "config.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from harness import run\n")
    (pkg / "run.py").write_text("import harness.config\n")
    (pkg / "sub" / "__init__.py").write_text("from . import mod\n")
    (pkg / "sub" / "mod.py").write_text("from harness.sub import X\n")
    g = graph(tmp_path, ("harness",))
    assert g["harness.config"] == set() and g["harness.uri"] == {"harness.config"}
    assert g["harness.sub"] == {"harness.sub.mod"} and g["harness.sub.mod"] == {"harness.sub"}
    assert find_cycle(g) is None
    assert layer_violations(g) == ["leaf harness.uri imports harness.config"]
    (pkg / "config.py").write_text("def g():\n    import harness.run\n")
    g = graph(tmp_path, ("harness",))
    assert find_cycle(g) == ["harness.config", "harness.run", "harness.config"]
