"""Codegen's entry: the region subgraphs of a partitioned graph -> one TVM kernel library (cached).

Pipeline stage 3 of 4 (`dyntvm.pipeline`: frontend -> partition -> codegen -> runtime). Codegen knows
only the IR: it imports neither the frontend, the partitioner nor the runtime. Regions are lowered to
Relax functions (`relax_builder`, `converters`), scheduled for the target (`cpu_schedule`, `gpu`) and
built once; the library is kept in the on-disk compile cache (`cache`).
"""
from __future__ import annotations

from dataclasses import dataclass

from dyntvm.errors import CompileError, UnsupportedOpError

from ..ir.graph import Graph
from . import cache as _cache

TARGETS = ("cpu", "cuda")


class Stats:
    """Counters tests may assert on (e.g. one TVM build per model)."""
    builds = 0          # TVM builds actually run
    cache_hits = 0


stats = Stats()


def check_target(target: str) -> None:
    if target not in TARGETS:
        raise CompileError(f"compile: unknown target {target!r}; expected one of {', '.join(TARGETS)}")


def collect_regions(graph: Graph) -> list:
    """(name, subgraph) of every region node, control-flow bodies included (depth first)."""
    return [(n.attrs.name, n.subgraphs[0]) for n in graph.walk() if n.op == "region"]


def target_desc(target: str) -> str:
    """The concrete target (host CPU model and core count for "cpu"): kernels built for one CPU may
    use instructions another lacks, so the cache must not share them across machines."""
    if target == "cpu":
        from .cpu_schedule import cpu_target
        return str(cpu_target())
    from .gpu import cuda_target
    return str(cuda_target())


def build_executable(regions: list, target: str):
    """Build one TVM executable holding every region function (no caching)."""
    from .relax_builder import build_module, unsupported_ops
    missing = sorted({op for _, g in regions for op in unsupported_ops(g)})
    if missing:
        raise UnsupportedOpError(f"compile: no Relax converter for op(s) {', '.join(missing)}")
    mod = build_module(regions)
    stats.builds += 1
    if target == "cpu":
        from .cpu_schedule import build_cpu
        return build_cpu(mod)
    from .gpu import build_cuda
    return build_cuda(mod)


@dataclass
class Built:
    """The kernel library of a graph's regions."""
    lib: object                 # a loaded TVM module (from the cache) or the executable just built
    path: str | None            # the library file in the compile cache, if cached
    cached: bool                # True: loaded from the cache, nothing was built
    target_desc: str            # the concrete target the kernels were built for


def build(graph: Graph, target: str = "cpu", cache_dir: str | None = None, use_cache: bool = True) -> Built | None:
    """Build (or fetch from the compile cache) the kernels of every region of a partitioned `graph`.

    Returns None when the graph has no region (nothing to compile).
    """
    check_target(target)
    regions = collect_regions(graph)
    if not regions:
        return None
    desc = target_desc(target)
    key = _cache.cache_key(regions, desc)
    cdir = cache_dir or _cache.default_cache_dir()
    path = _cache.lookup(cdir, key) if use_cache else None
    cached = path is not None
    lib = None
    if cached:
        stats.cache_hits += 1
    else:
        ex = build_executable(regions, target)
        path = _cache.store(cdir, key, ex) if use_cache else None
        if path is None:
            lib = ex
    if path is not None:
        import tvm
        lib = tvm.runtime.load_module(path)
    return Built(lib, path, cached, desc)
