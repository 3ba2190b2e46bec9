"""The layering of the pipeline, checked on the source: frontend -> partition -> codegen -> runtime.

The import graph is built from the AST of every source file of the six packages (every `import` and
`from ... import`, including those inside functions; relative imports resolved; `dyntvm.X.Y` mapped to
its file). It must have no cycle between files, and each stage may import only the layers below it
(DESIGN section 2). `dyntvm/__init__.py` resolves its lazy attributes through a string table with
importlib: that is not an import edge. Implicit imports of parent packages are not edges either (Python
runs a package's `__init__` before any of its modules, whichever imports first).
"""
from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys

import networkx as nx
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# import name -> source folder (pyproject.toml's package-dir)
PACKAGES = {"dyntvm": "dyntvm", "dyntvm.ir": "ir", "dyntvm.frontend": "frontend",
            "dyntvm.partition": "partition", "dyntvm.codegen": "codegen", "dyntvm.runtime": "runtime"}

# layer -> the layers (or single modules) it may import; "dyntvm" is the root package's __init__, which
# is loaded before any dyntvm module anyway (runtime/artifact.py reads dyntvm.__version__ from it)
ALLOWED = {
    "ir": {"ir", "dyntvm.errors", "dyntvm"},
    "runtime": {"runtime", "ir", "dyntvm.errors", "dyntvm.native", "dyntvm"},
    "partition": {"partition", "ir", "dyntvm.errors", "dyntvm"},
    "codegen": {"codegen", "ir", "dyntvm.errors", "dyntvm.native", "dyntvm"},
    "frontend": {"frontend", "ir", "runtime", "dyntvm.errors", "dyntvm"},
}


def _modules() -> dict[str, str]:
    """Module name -> path relative to the repository root, for every source file."""
    mods = {}
    for pkg, folder in PACKAGES.items():
        for dirpath, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = sorted(d for d in dirs if os.path.exists(os.path.join(dirpath, d, "__init__.py")))
            rel = os.path.relpath(dirpath, os.path.join(ROOT, folder))
            sub = pkg if rel == "." else f"{pkg}.{rel.replace(os.sep, '.')}"      # nested subpackages too
            for fn in sorted(files):
                if fn.endswith(".py"):
                    stem = fn[:-3]
                    mods[sub if stem == "__init__" else f"{sub}.{stem}"] = os.path.relpath(
                        os.path.join(dirpath, fn), ROOT)
    return mods


MODULES = _modules()


def _layer(mod: str) -> str:
    """"ir", "frontend", ... for a module of a stage; the module itself for one of the `dyntvm` folder."""
    for pkg, folder in PACKAGES.items():
        if pkg != "dyntvm" and (mod == pkg or mod.startswith(pkg + ".")):
            return folder
    return mod


def _resolve(name: str) -> str | None:
    """The dyntvm module a dotted import name loads: the longest known prefix (None: not ours)."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        cand = ".".join(parts[:k])
        if cand in MODULES:
            return cand
    return None


def _imports(mod: str, path: str) -> list[tuple[str, int, str]]:
    """(imported module, line, import statement) for every import of a dyntvm module in `path`."""
    with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read(), path)
    package = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name)
                if target:
                    out.append((target, node.lineno, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names: dict[str, list[str]] = {}
            for alias in node.names:
                # `from pkg import submodule` imports the submodule; `from mod import name`, the module
                sub = f"{base}.{alias.name}"
                target = sub if sub in MODULES else _resolve(base)
                if target:
                    names.setdefault(target, []).append(alias.name)
            for target, aliases in names.items():
                out.append((target, node.lineno,
                            f"from {'.' * node.level}{node.module or ''} import {', '.join(aliases)}"))
    return out


def import_graph() -> nx.DiGraph:
    """Files as nodes (module names), an edge per importing file and imported file; edge attribute
    `where`: every 'file:line: statement' behind it."""
    g = nx.DiGraph()
    g.add_nodes_from(MODULES)
    for mod, path in MODULES.items():
        for target, line, text in _imports(mod, path):
            if target != mod:
                if not g.has_edge(mod, target):
                    g.add_edge(mod, target, where=[])
                g.edges[mod, target]["where"].append(f"{path}:{line}: {text}")
    return g


def _describe(g: nx.DiGraph, cycle: list[str]) -> str:
    return "\n".join("    " + w for a, b in zip(cycle, cycle[1:] + cycle[:1]) for w in g.edges[a, b]["where"])


def test_graph_sees_the_imports():
    """The graph builder itself: relative, absolute and in-function imports become edges."""
    g = import_graph()
    assert g.has_edge("dyntvm.runtime.model", "dyntvm.runtime.executor")       # from .executor import
    assert g.has_edge("dyntvm.frontend.ops", "dyntvm.ir.attrs")                 # from ..ir import attrs as A
    assert g.has_edge("dyntvm.runtime.model", "dyntvm.errors")                  # from dyntvm.errors import
    assert g.has_edge("dyntvm.cli", "dyntvm.loader")                            # inside a function
    assert not any(t == "dyntvm.frontend.F" for _, t in g.out_edges("dyntvm"))  # the lazy table is no edge


def test_no_import_cycles():
    g = import_graph()
    cycles = sorted(nx.simple_cycles(g), key=len)
    msg = "\n".join(f"import cycle {' -> '.join(c + c[:1])}:\n{_describe(g, c)}" for c in cycles[:10])
    if not nx.is_directed_acyclic_graph(g):
        pytest.fail(f"{len(cycles)} import cycle(s) between files (shortest first):\n{msg}", pytrace=False)


def test_layers():
    g = import_graph()
    bad = []
    for a, b, where in sorted(g.edges(data="where")):
        la = _layer(a)
        if la not in ALLOWED:
            continue                # the dyntvm folder (pipeline, CLI) may import every stage
        lb = _layer(b)
        if lb not in ALLOWED[la] and b not in ALLOWED[la]:
            bad += [f"{la} may not import {lb} ({b}): {w}" for w in where]
    if bad:
        pytest.fail("layering broken:\n" + "\n".join(bad) + "\nallowed:\n" + "\n".join(
            f"  {k} -> {', '.join(sorted(v))}" for k, v in ALLOWED.items()), pytrace=False)


def test_pipeline_order():
    """`dyntvm.pipeline` is where the stages meet, and codegen builds without knowing the others."""
    g = import_graph()
    used = {_layer(b) for b in nx.descendants(g, "dyntvm.pipeline")}
    assert {"frontend", "partition", "codegen", "runtime"} <= used
    assert not any(_layer(b) in ("frontend", "partition", "runtime") for b in nx.descendants(g, "dyntvm.codegen.build"))


FRESH_IMPORTS = """
import importlib, sys, traceback
mods, forbidden = sys.argv[1].split(","), tuple(sys.argv[2].split(",")) if sys.argv[2] else ()
failed = []
for m in mods:
    for k in [k for k in sys.modules if k == "dyntvm" or k.startswith("dyntvm.")]:
        del sys.modules[k]                   # a clean slate: m is the first dyntvm module imported
    try:
        importlib.import_module(m)
    except Exception:
        failed.append(f"import {m} alone failed:\\n{traceback.format_exc(limit=-3)}")
        continue
    bad = sorted(k for k in sys.modules if k in forbidden or k.startswith(tuple(f + "." for f in forbidden)))
    if bad:
        failed.append(f"import {m} alone pulled in {', '.join(bad)}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def _alone_cases():
    stages = [p for p in PACKAGES if p != "dyntvm"]
    cases = [("dyntvm", ["dyntvm"], stages + ["dyntvm.pipeline"]),      # the lazy table imports no stage
             ("dyntvm/", [m for m in MODULES if MODULES[m].startswith("dyntvm/") and not m.endswith("__main__")], [])]
    for pkg in stages:
        layer = PACKAGES[pkg]
        forbidden = [p for p in stages if PACKAGES[p] not in ALLOWED[layer]] + ["dyntvm.pipeline"]
        cases.append((pkg, [m for m in MODULES if _layer(m) == layer], forbidden))
    return cases


@pytest.mark.parametrize("label,mods,forbidden", _alone_cases(), ids=[c[0] for c in _alone_cases()])
def test_imports_alone(label, mods, forbidden):
    """Each module imports as the first dyntvm module of an interpreter (dyntvm's modules are removed
    from sys.modules before each; TVM and numpy stay loaded) and pulls in no stage it may not import.
    One subprocess per stage."""
    r = subprocess.run([sys.executable, "-c", FRESH_IMPORTS, ",".join(mods), ",".join(forbidden)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    if r.returncode:
        pytest.fail(f"{label}:\n{r.stdout[-4000:]}{r.stderr[-2000:]}", pytrace=False)


def test_no_source_file_over_600_lines():
    """House limit (STYLE.md): split a file by concern before it grows past ~600 lines."""
    root = pathlib.Path(__file__).resolve().parent.parent
    long = [f"{p.relative_to(root)}: {n} lines" for pkg in ("dyntvm", "ir", "frontend", "partition", "codegen",
                                                            "runtime", "examples")
            for p in sorted((root / pkg).rglob("*.py")) if (n := len(p.read_text().splitlines())) > 600]
    assert not long, "source files over 600 lines:\n" + "\n".join(long)


def test_every_subpackage_is_in_the_package_list():
    """A non-editable `pip install .` installs only the packages pyproject.toml lists: a folder with an
    __init__.py left out (dyntvm.codegen.converters was) breaks compiling there while the editable install
    used by the tests works."""
    import tomllib
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        tool = tomllib.load(f)["tool"]["setuptools"]
    listed, dirs = set(tool["packages"]), tool["package-dir"]
    for pkg, folder in dirs.items():
        for here, subdirs, files in os.walk(os.path.join(root, folder)):
            subdirs[:] = [d for d in subdirs if not d.startswith((".", "__"))]
            if "__init__.py" in files:
                rel = os.path.relpath(here, os.path.join(root, folder))
                name = pkg if rel == "." else pkg + "." + rel.replace(os.sep, ".")
                assert name in listed, f"{name} ({here}) is missing from [tool.setuptools] packages"
                if name != pkg and name in dirs:
                    assert os.path.samefile(os.path.join(root, dirs[name]), here)
