"""`dt.compile` and `dt.hybridize`: the pipeline, stage by stage.

    frontend.tracer.trace    Python function -> Graph                     (skipped for a traced Graph)
    partition.partition      Graph -> Graph with region nodes (static parts), recursing into bodies
    runtime.fold.fold_constants   input-less regions -> constants (evaluated with the reference interpreter)
    codegen.build.build      region subgraphs -> one TVM kernel library (compile cache)
    runtime.model.CompiledModel   the partitioned graph + the kernels, run by the executor

This is the only module that imports every stage; the stages import only the layers below them
(`ir`, and for the frontend the runtime's kernels), which `tests/test_layering.py` checks.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from .codegen.build import build, check_target
from .codegen.cache import is_uncached
from .errors import CompileError, InputError
from .frontend.tracer import TensorSpec, trace
from .ir.graph import Graph
from .ir.tree import tree_flatten, tree_unflatten
from .partition import partition
from .runtime.artifact import kernel_binding
from .runtime.fold import fold_constants
from .runtime.model import CompiledModel, virtual_machine


# TVM's Relax BlockBuilder keeps one stack for the process: builds from several threads (e.g. a hybridized
# function called from threads) take turns. Tracing and partitioning need no lock.
_BUILD_LOCK = threading.Lock()


def partition_graph(graph: Graph, selector=None) -> Graph:
    """The graph `compile` builds: partitioned into regions, input-less regions folded to constants."""
    return fold_constants(partition(graph, selector))


def compile(fn_or_graph, *specs, target: str = "cpu", selector=None, cache_dir: str | None = None,
            use_cache: bool = True) -> CompiledModel:
    """Compile a model function (traced with `specs`) or a traced Graph.

    Args:
        fn_or_graph: a Python function of `dyntvm.F` ops, or a `dt.Graph` from `dt.trace`.
        *specs: `dt.TensorSpec` per argument (only for a function).
        target: "cpu" (LLVM for the host CPU), "cuda" (the local GPU's arch, else sm_90) or "cuda:sm_XX".
            A CUDA build needs nvcc but no GPU: without one the model cannot run here, but saves an
            artifact with device code that runs on a GPU host.
        selector: a `dyntvm.partition.Selector` deciding what goes into compiled regions.
        cache_dir: compile cache folder (default: the user cache dir, or $DYNTVM_CACHE_DIR). A bad
            cache entry is rebuilt, and an unusable folder means an uncached build (both warn).

    Example:
        >>> model = dt.compile(lambda x: F.tanh(x) * 2, dt.TensorSpec(("N", 4)))
        >>> model(np.ones((3, 4), "float32")).shape
        (3, 4)
    """
    kind = check_target(target)
    t0 = time.perf_counter()
    if isinstance(fn_or_graph, Graph):
        if specs:
            raise CompileError("compile: specs are only for a function; this graph is already traced")
        graph = fn_or_graph
    elif callable(fn_or_graph):
        graph = trace(fn_or_graph, *specs)
    else:
        raise CompileError(f"compile: expected a function or a dt.Graph, got {type(fn_or_graph).__name__}")
    pg = partition_graph(graph, selector)
    # the kernels carry a digest of the regions they implement; `dt.load` checks it against graph.json
    binding = kernel_binding(pg) if any(n.op == "region" for n in pg.walk()) else None
    with _BUILD_LOCK:
        built = build(pg, target, cache_dir, use_cache, binding=binding)
    vm = virtual_machine(built.lib, kind) if built and built.lib is not None else None
    info = {"compile_time_s": round(time.perf_counter() - t0, 3),
            "cache": "hit" if built and built.cached else "miss"}
    if built:
        info["built_for"] = built.target_desc      # recorded in artifacts: the CPU the kernels target
        if kind == "cpu":                          # dt.load refuses a CPU lacking one of these
            from .native import cpu_features
            info["cpu_features"] = sorted(cpu_features())
    if kind == "cuda" and built:
        info["cuda_arch"] = _arch_of(built.target_desc)
    model = CompiledModel(pg, vm, kind, built.lib if built else None, info)
    model.lib_path = built.path if built else None
    model.lib_sha256 = built.sha256 if built else None
    if built and built.path:        # `save` writes these bytes: the cache entry may be removed meanwhile
        with open(built.path, "rb") as f:
            model.lib_bytes = f.read()
        if is_uncached(built.path):            # a private copy (uncached CUDA build without a GPU): not kept
            os.remove(built.path)
            model.lib_path = None
    return model


def _arch_of(desc: str) -> str | None:
    import json
    try:
        return json.loads(desc).get("arch")
    except (ValueError, AttributeError):
        return None


def hybridize(fn, target: str = "cpu", dynamic=(), selector=None, cache_dir=None):
    """Compile `fn` on first call and cache per input signature (MXNet's hybridize).

    The signature of a call is the dtype and rank of every input, plus the size of every axis not
    named dynamic. `dynamic` gives, per argument, a tuple with a symbol name for each axis that stays
    symbolic (None: specialize to the call's size); ``dynamic="all"`` keeps every axis symbolic.

    Example:
        >>> fast = dt.hybridize(lstm, dynamic=(("T", "B", None), ("B", None), ("B", None)))
        >>> hs, h = fast(xs, h0, c0)     # one compile serves every T and B
    """
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

    def call(*args, **kwargs):
        if kwargs:
            raise InputError(f"a hybridized function takes its inputs by position; got keyword argument"
                             f"{'s' if len(kwargs) > 1 else ''} {', '.join(map(repr, kwargs))}")
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
