"""The layer rules of gac's import graph (docs/architecture.md), read from the source with ``ast``.

Every ``import gac...`` / ``from gac... import ...`` counts, at module level and inside
functions alike (a function-level import is an edge all the same; it only runs later).
``python tests/test_architecture.py`` prints the graph's cycles and upward edges.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

#: Packages that hold what the library is made of; none may reach up into the user-facing layer.
LOW = ("gac.nn", "gac.kernels", "gac.hardware", "gac.models")
#: The user-facing layer: the typer commands, the CLI, the workflow API and the plan runner.
TOP = ("gac.commands", "gac.cli", "gac.api", "gac.plans", "gac.llm_eval", "gac.llm_run")
#: The only gac modules ``gac.nn`` may import (it sits at the bottom).
NN_MAY_IMPORT = ("gac.nn", "gac.errors", "gac.compat")
#: gac.nn's one upward edge: LatentAttention imports the decode kernel's file inside the methods that
#: run a step (that file imports only the base floor, checked below).
NN_KERNEL_EDGE = ("gac.nn.latent", "gac.kernels.latent_attention")

#: The floors of docs/architecture.md, lowest first: a module may import its own floor and those below.
#: A module takes the floor of the longest name here that it is or sits under: ``gac.hardware`` is the
#: measurement floor, but the latency model, ``gac profile``'s measurement and its refinement price a
#: model's layers with the kernels that run them, and the loader reads saved and repaired directories.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("gac.errors", "gac.compat", "gac.guard", "gac.utils", "gac.alignment", "gac.sites", "gac.data"),
    ("gac.nn", "gac.testing"),
    ("gac.hardware",),
    ("gac.models", "gac.io", "gac.hf_config", "gac.hf_auto"),
    ("gac.kernels",),
    ("gac.surgery", "gac.models.loading"),
    ("gac.hardware.latency", "gac.hardware.profiler", "gac.hardware.refine"),
    ("gac.compressors", "gac.allocation"),
    ("gac.runtime",),
    ("gac.eval",),
    ("gac.api", "gac.recovery"),
    ("gac.plans", "gac.llm_eval", "gac.llm_run"),
    ("gac.commands", "gac.cli", "gac.__main__"),
)

#: Imports from a lower floor to a higher one that exist today, each named in docs/architecture.md.
#: The list may shrink; a new one fails the test.
KNOWN_UPWARD = {
    # the package re-exports the loader (``gac.models.load_model``, a documented entry point) on first
    # use; the adapters that io and surgery import from the package stay below them
    ("gac.models", "gac.models.loading"),
    NN_KERNEL_EDGE,  # LatentAttention's decode step calls its Triton kernel
}


def modules(src: Path = SRC) -> dict[str, Path]:
    """``{dotted name: path}`` of every module under ``src/gac`` (a package is its ``__init__``)."""
    out = {}
    for p in sorted((src / "gac").rglob("*.py")):
        parts = list(p.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = p
    return out


#: The import cycles of today (docs/architecture.md); a cycle must stay inside one of them.
KNOWN_CYCLES: tuple[set[str], ...] = ()


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` (a module or a name inside one) starts with."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(src: Path = SRC) -> list[tuple[str, str, str]]:
    """``(importer, module, name)`` for each private name one module takes from another:
    ``from gac.x import _name``, or ``x._name`` where ``x`` names a gac module imported here."""
    known = modules(src)
    out = []
    for mod, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        aliases: dict[str, str] = {}  # local name -> gac module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gac"):
                for a in node.names:
                    if _private(a.name) and node.module != mod:
                        out.append((mod, node.module, a.name))
                    if f"{node.module}.{a.name}" in known:
                        aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                aliases.update({a.asname: a.name for a in node.names if a.asname and a.name in known})
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and _private(node.attr):
                target = aliases.get(node.value.id)
                if target and target != mod:
                    out.append((mod, target, node.attr))
    return sorted(set(out))


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """``{module: modules it imports}`` within gac, module-level and function-level imports."""
    known = modules(src)
    graph: dict[str, set[str]] = {m: set() for m in known}
    for mod, path in known.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative
                    up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" for a in node.names] if base else []
            for t in targets:
                if t == "gac" or not t.startswith("gac."):
                    continue
                r = _resolve(t, known)
                if r and r != mod and r != "gac":
                    graph[mod].add(r)
    return graph


def _in(mod: str, prefixes: tuple[str, ...]) -> bool:
    return any(mod == p or mod.startswith(p + ".") for p in prefixes)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out, key=len, reverse=True)


def test_the_graph_sees_function_level_imports(tmp_path):
    pkg = tmp_path / "gac"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from gac.sub.a import f\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    from gac.b import g\n    from . import c\n")
    (pkg / "sub" / "c.py").write_text("")
    (pkg / "b.py").write_text("import gac.sub.a\nfrom gac.sub import _private, c as sc\nsc._hidden()\n")
    g = import_graph(tmp_path)
    assert g["gac.sub.a"] == {"gac.b", "gac.sub.c"} and g["gac.b"] == {"gac.sub.a", "gac.sub", "gac.sub.c"}
    assert cycles(g) == [["gac.b", "gac.sub", "gac.sub.a"]]
    assert private_imports(tmp_path) == [("gac.b", "gac.sub", "_private"), ("gac.b", "gac.sub.c", "_hidden")]


def floor_of(mod: str) -> int | None:
    """The floor of the longest name in :data:`FLOORS` that ``mod`` is or sits under."""
    best: tuple[int, int] | None = None  # (length of the name, floor)
    for i, floor in enumerate(FLOORS):
        for p in floor:
            if _in(mod, (p,)) and (best is None or len(p) > best[0]):
                best = (len(p), i)
    return None if best is None else best[1]


def upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The imports from a module to one on a higher floor."""
    out = set()
    for m, ts in graph.items():
        for t in ts:
            fm, ft = floor_of(m), floor_of(t)
            if fm is not None and ft is not None and ft > fm:
                out.add((m, t))
    return out


def test_every_module_has_a_floor():
    assert [m for m in import_graph() if m != "gac" and floor_of(m) is None] == []


def test_no_new_import_goes_up_a_floor():
    new = sorted(upward(import_graph()) - KNOWN_UPWARD)
    assert not new, f"imports up a floor (docs/architecture.md): {new}"


def test_no_new_import_cycle():
    new = [c for c in cycles(import_graph()) if not any(set(c) <= k for k in KNOWN_CYCLES)]
    assert not new, f"import cycles beyond docs/architecture.md's: {new}"


def test_nothing_low_imports_the_user_facing_layer():
    g = import_graph()
    bad = sorted((m, t) for m, ts in g.items() if _in(m, LOW) for t in ts if _in(t, TOP))
    assert not bad, f"imports from {LOW} up into {TOP}: {bad}"


def test_nn_sits_at_the_bottom():
    g = import_graph()
    assert "gac.nn.factorized" in g
    bad = sorted(
        (m, t)
        for m, ts in g.items()
        if _in(m, ("gac.nn",))
        for t in ts
        if not _in(t, NN_MAY_IMPORT) and (m, t) != NN_KERNEL_EDGE
    )
    assert not bad, f"gac.nn imports above itself: {bad}"
    # the one edge up stays shallow: the kernel file reaches nothing above the base floor, itself or through the
    # kernel files it launches (its Gluon kernel, gac.kernels.latent_gluon)
    kernel = NN_KERNEL_EDGE[1]
    reach, todo = set(), [kernel]
    while todo:
        for t in g[todo.pop()]:
            if t not in reach:
                reach.add(t)
                if _in(t, ("gac.kernels",)):
                    todo.append(t)
    assert all(floor_of(t) == 0 or _in(t, ("gac.kernels",)) for t in reach), (
        f"{kernel} reaches {sorted(reach)}"
    )


def test_palu_module_types_sit_in_nn():
    """LatentAttention and its kin live in gac.nn: models and hardware reach them without going up."""
    g = import_graph()
    assert "gac.nn.latent" in g
    for low in ("gac.models.adapters", "gac.models.inventory", "gac.hardware.latency"):
        assert "gac.nn.latent" in g[low] and "gac.surgery.latent_attention" not in g[low]
    assert not any("gac.surgery.latent_attention" in c for c in cycles(g))


def test_a_module_takes_the_floor_of_its_longest_listed_name():
    assert floor_of("gac.hardware.profile") < floor_of("gac.models.adapters") < floor_of("gac.kernels.gemv")
    assert floor_of("gac.kernels.gemv") < floor_of("gac.models.loading") == floor_of("gac.surgery.repair")
    assert floor_of("gac.surgery.repair") < floor_of("gac.hardware.latency") < floor_of("gac.allocation")
    assert floor_of("gac.models") == floor_of("gac.io") < floor_of("gac.plans.variants")


def _imported_after(code: str) -> set[str]:
    """The ``gac`` modules and heavy dependencies that running ``code`` in a fresh interpreter imports."""
    probe = f"{code}\nimport sys\nprint(' '.join(sorted(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env)
    return set(out.stdout.split())


def test_the_import_promises_the_floors_rely_on():
    """What the lazy imports are for: ``import gac`` stays torch-free; the adapters (which io and surgery
    import) do not import the loader above them, ``gac.models.load_model`` still does."""
    assert not {"torch", "transformers", "gac.io"} & _imported_after("import gac")
    low = _imported_after("import gac.models.adapters")
    assert "gac.models.loading" not in low and "gac.surgery.repair" not in low
    assert "gac.models.loading" in _imported_after("import gac.models; gac.models.load_model")


def test_no_module_imports_another_modules_private_name():
    assert private_imports() == []


if __name__ == "__main__":
    graph = import_graph()
    for comp in cycles(graph):
        print(f"cycle of {len(comp)}: {', '.join(comp)}")
        for m in comp:
            print(f"  {m} -> {', '.join(sorted(graph[m] & set(comp)))}")
    print(f"{sum(map(len, graph.values()))} edges among {len(graph)} modules")
    for m, t in sorted(upward(graph)):
        print(f"up a floor: {m} -> {t}")
    for importer, module, name in private_imports():
        print(f"private import: {importer} imports {module}.{name}")
