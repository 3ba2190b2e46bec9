"""`dt.compile` and `dt.hybridize`: trace -> partition -> Relax -> TVM build (cached) -> CompiledModel."""
from __future__ import annotations

import logging
import time

import numpy as np

from dyntvm.errors import CompileError, UnsupportedOpError

from ..ir.graph import Graph
from ..runtime.model import CompiledModel
from . import cache as _cache

log = logging.getLogger("dyntvm.codegen")


class Stats:
    """Counters tests may assert on (e.g. one TVM build per model)."""
    builds = 0          # TVM builds actually run
    cache_hits = 0


stats = Stats()
TARGETS = ("cpu", "cuda")


def _collect_regions(graph: Graph) -> list:
    return [(n.attrs.name, n.subgraphs[0]) for n in graph.walk() if n.op == "region"]


def _target_desc(target: str) -> str:
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


def compile(fn_or_graph, *specs, target: str = "cpu", selector=None, cache_dir: str | None = None,
            use_cache: bool = True) -> CompiledModel:
    """Compile a model function (traced with `specs`) or a traced Graph.

    Args:
        fn_or_graph: a Python function of `dyntvm.F` ops, or a `dt.Graph` from `dt.trace`.
        *specs: `dt.TensorSpec` per argument (only for a function).
        target: "cpu" (LLVM for the host CPU) or "cuda".
        selector: a `dyntvm.partition.Selector` deciding what goes into compiled regions.
        cache_dir: compile cache folder (default: the user cache dir, or $DYNTVM_CACHE_DIR).

    Example:
        >>> model = dt.compile(lambda x: F.tanh(x) * 2, dt.TensorSpec(("N", 4)))
        >>> model(np.ones((3, 4), "float32")).shape
        (3, 4)
    """
    from ..partition import partition
    if target not in TARGETS:
        raise CompileError(f"compile: unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    t0 = time.perf_counter()
    if isinstance(fn_or_graph, Graph):
        if specs:
            raise CompileError("compile: specs are only for a function; this graph is already traced")
        graph = fn_or_graph
    elif callable(fn_or_graph):
        from ..frontend.tracer import trace
        graph = trace(fn_or_graph, *specs)
    else:
        raise CompileError(f"compile: expected a function or a dt.Graph, got {type(fn_or_graph).__name__}")
    pg = partition(graph, selector)
    regions = _collect_regions(pg)
    vm, lib, cached, path = None, None, False, None
    if regions:
        import tvm
        from tvm import relax
        key = _cache.cache_key(regions, _target_desc(target))
        cdir = cache_dir or _cache.default_cache_dir()
        path = _cache.lookup(cdir, key) if use_cache else None
        if path is not None:
            stats.cache_hits += 1
            cached = True
        else:
            ex = build_executable(regions, target)
            path = _cache.store(cdir, key, ex) if use_cache else None
            if path is None:
                lib = ex
        if path is not None:
            lib = tvm.runtime.load_module(path)
        dev = tvm.cpu() if target == "cpu" else tvm.cuda()
        vm = relax.VirtualMachine(lib, dev)
    info = {"compile_time_s": round(time.perf_counter() - t0, 3), "cache": "hit" if cached else "miss"}
    if regions:
        info["built_for"] = _target_desc(target)      # recorded in artifacts: the CPU the kernels target
    model = CompiledModel(pg, vm, target, lib, info)
    model.lib_path = path
    return model


def hybridize(fn, target: str = "cpu", dynamic=(), selector=None, cache_dir=None):
    """Compile `fn` on first call and cache per input signature (MXNet's hybridize).

    The signature of a call is the dtype and rank of every input, plus the size of every axis not
    named dynamic. `dynamic` gives, per argument, a tuple with a symbol name for each axis that stays
    symbolic (None: specialize to the call's size); ``dynamic="all"`` keeps every axis symbolic.

    Example:
        >>> fast = dt.hybridize(lstm, dynamic=(("T", "B", None), ("B", None), ("B", None)))
        >>> hs, h = fast(xs, h0, c0)     # one compile serves every T and B
    """
    from ..frontend.tracer import TensorSpec
    from ..ir.tree import tree_flatten, tree_unflatten
    compiled: dict = {}
    is_leaf = lambda x: isinstance(x, np.ndarray)

    def specs_for(args):
        leaves, spec = tree_flatten(list(args), is_leaf=is_leaf)
        specs = []
        for i, x in enumerate(leaves):
            x = np.asarray(x)
            names = dynamic if dynamic == "all" else (dynamic[i] if i < len(dynamic) else ())
            shape = tuple(f"d{i}_{ax}" if names == "all" else
                          (names[ax] if ax < len(names) and names[ax] is not None else int(s))
                          for ax, s in enumerate(x.shape))
            specs.append(TensorSpec(shape, x.dtype.name))
        return spec, specs

    def call(*args):
        spec, specs = specs_for(args)
        sig = (str(spec),) + tuple((s.dtype, s.shape) for s in specs)
        model = compiled.get(sig)
        if model is None:
            model = compiled[sig] = compile(fn, *tree_unflatten(spec, specs), target=target, selector=selector,
                                            cache_dir=cache_dir)
        return model(*args)

    call.compiled = compiled
    call.__wrapped__ = fn
    call.__name__ = getattr(fn, "__name__", "hybridized")
    return call
