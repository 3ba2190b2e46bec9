"""Codegen's entry: the region subgraphs of a partitioned graph -> one TVM kernel library (cached).

Pipeline stage 3 of 4 (`dyntvm.pipeline`: frontend -> partition -> codegen -> runtime). Codegen knows
only the IR: it imports neither the frontend, the partitioner nor the runtime. Regions are lowered to
Relax functions (`relax_builder`, `converters`), scheduled and built once by the target's backend
(`backends`: `backends/cpu`, `backends/cuda`); the library is kept in the on-disk compile cache (`cache`).
"""
from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass

from dyntvm.errors import CompileError, UnsupportedOpError

from ..ir.graph import Graph
from ..native import execution_binding, execution_facts, shared_object_problem
from . import cache as _cache
from .backends import Backend, resolve


class Stats:
    """Counters tests may assert on (e.g. one TVM build per model)."""
    builds = 0          # TVM builds actually run
    cache_hits = 0
    tuned_kernels = 0   # kernels built with a tuning log's schedule (CUDA builds in a child process included)


stats = Stats()


def check_target(target: str) -> str:
    """The backend name of a target string ("cpu", "cuda" or "cuda:sm_XX": `backends.resolve`), checked."""
    return resolve(target).name


def mask_gathers(graph: Graph) -> list:
    """(name, subgraph) of a ``take`` kernel per kind (dtype, rank, axis) of `boolean_mask` in `graph`: on a
    device the executor computes the mask's indices on the host and gathers the data on the device with it
    (`ir.ops.mask_gather_name`)."""
    from ..ir.graph import Node, Value
    from ..ir.ops import get_op, mask_gather_name
    from ..ir.types import TensorType
    kinds = sorted({(t.dtype, t.ndim, n.attrs.axis % t.ndim) for n in graph.walk() if n.op == "boolean_mask"
                    for t in [n.inputs[0].type] if t.ndim})
    take = get_op("take")
    out = []
    for dtype, rank, axis in kinds:
        data = Value(TensorType(tuple(f"G{i}" for i in range(rank)), dtype), "data")
        idx = Value(TensorType(("K",), "int64"), "idx")
        attrs = take.attrs(axis)
        node = Node("take", (data, idx), attrs, name="take")
        (t,) = take.infer_type([data.type, idx.type], attrs)
        node.outputs = (Value(t, "out", node, 0),)
        name = mask_gather_name(dtype, rank, axis)
        out.append((name, Graph([data, idx], [node], list(node.outputs), name=name)))
    return out


def check_compiler() -> None:
    """TVM's compiler library must be loadable (not a runtime-only TVM, nor `TVM_USE_RUNTIME_LIB=1`)."""
    try:
        from tvm import relax  # noqa: F401
    except (ImportError, AttributeError) as e:
        raise CompileError("compile: TVM's compiler is not available in this process (a runtime-only TVM, or "
                           f"TVM_USE_RUNTIME_LIB is set: {type(e).__name__}: {e}); compiled artifacts still load "
                           "and run with dt.load") from None


def check_host_compiler() -> None:
    """TVM links every kernel library with the host's C/C++ compiler ($CXX, $CC, else g++, gcc, clang, cc on
    PATH): say so before building instead of failing with a raw error when the library is written."""
    import shutil

    from tvm.support.cc import get_cc
    cc = get_cc()
    if cc is None:
        raise CompileError("compile: linking the kernel library needs a C/C++ compiler (g++, gcc, clang or cc on "
                           "PATH, or $CXX / $CC); none was found")
    if shutil.which(cc) is None:
        raise CompileError(f"compile: $CXX / $CC names {cc!r}, which is not an executable; the kernel library is "
                           "linked with it")


def collect_regions(graph: Graph) -> list:
    """(name, subgraph) of every region node, control-flow bodies included (depth first); a name once: regions
    sharing a name compute the same function (`shared_regions`)."""
    out: dict = {}
    for n in graph.walk():
        if n.op == "region" and n.attrs.name not in out:
            out[n.attrs.name] = n.subgraphs[0]
    return list(out.items())


def concrete_target(target: str):
    """The TVM target of a target string (`Backend.concrete_target`: the host CPU model and core count for
    "cpu"; the arch for CUDA: the requested one, the local GPU's, or sm_90)."""
    return resolve(target).concrete_target(target)


def target_desc(target: str) -> str:
    """The concrete target as a string: kernels built for one CPU may use instructions another lacks, so
    the cache must not share them across machines."""
    return str(concrete_target(target))


def recorded_facts(backend: Backend, tvm_target, desc: str, tuning) -> dict:
    """The model info fields that decide how a library's kernels run, in their JSON form: the concrete target,
    what the backend records for dt.load to check (`Backend.recorded_facts`: the CPU features the kernels may
    use, the CUDA arch), and the specializations of a tuning log. The library is bound to them
    (`native.execution_binding`)."""
    facts: dict = {"built_for": desc, **backend.recorded_facts(tvm_target, desc)}
    if tuning is not None:
        facts["tuning"] = {"specialized": {r: [[dict(combo), name] for combo, name in specs]
                                           for r, specs in tuning[1].items()}}
    return json.loads(json.dumps(facts))


BINDING_FUNCTION = "dyntvm_binding"   # runtime/artifact.py reads it under the same name


def add_binding(mod, binding: str):
    """Add a function `BINDING_FUNCTION` returning `binding` (a sha256 hex digest) as uint8 bytes.

    The digest (`dyntvm.runtime.artifact.kernel_binding`) covers the whole graph's structure and
    constants; `dt.load` calls this function through the Relax VM (runtime only) and refuses a
    library whose digest differs from the one of the artifact's graph.json + params.npz.
    """
    import numpy as np
    from tvm import relax
    if any(gv.name_hint == BINDING_FUNCTION for gv in mod.get_global_vars()):
        raise CompileError(f"a region is named {BINDING_FUNCTION!r}, which dyntvm reserves")
    bb = relax.BlockBuilder(mod)
    with bb.function(BINDING_FUNCTION, []):
        bb.emit_func_output(relax.const(np.frombuffer(bytes.fromhex(binding), np.uint8).copy()))
    return bb.get()


def build_executable(regions: list, target, binding: str | None = None, tvm_target=None, loops=(),
                     tuning=None, program=None):
    """Build one TVM executable holding every region function (no caching), plus the binding
    function when `binding` is given. `target`: a target string or its `Backend` (`tvm_target`: the concrete one).
    `loops`: foreach / while_loop loops to compile end to end (`compiled_loops.loop_specs`).
    `tuning`: ``(tuning.TuningLog, specializations)``: the regions' specializations are added and
    their kernels scheduled with the log's winning traces.
    `program`: ``(graph, key prefix)``: add the VM program of the whole graph (CPU; `vm_program`); should the
    build with it fail, the library is built without it (warned)."""
    from .relax_builder import build_module, unsupported_ops
    backend = target if isinstance(target, Backend) else resolve(target)
    check_host_compiler()
    missing = sorted({op for _, g in regions for op in unsupported_ops(g)})
    if missing:
        raise UnsupportedOpError(f"compile: no Relax converter for op(s) {', '.join(missing)}")
    tuned = None
    if tuning is not None:
        from .tuning import specialized_regions
        log, table = tuning
        regions = regions + specialized_regions(regions, table)

        def tuned(func):
            new = log.tuned(func, tvm_target)
            if new is not None:
                stats.tuned_kernels += 1
            return new
    mod = build_module(regions, device_checks=backend.device_checks)
    if binding is not None:
        mod = add_binding(mod, binding)
    stats.builds += 1
    if program is not None and backend.vm_program:
        from .vm_program import build_with_program
        ex = build_with_program(backend.build, mod, tvm_target, loops, tuned, program)
        if ex is not None:
            return ex
    return backend.build_with_loops(mod, tvm_target, loops, tuned)


@dataclass
class Built:
    """The kernel library of a graph's regions."""
    lib: object                 # a loaded TVM module (from the cache) or the executable just built; None for
                                # CUDA kernels built on a machine without a GPU (they cannot load here)
    path: str | None            # the library file in the compile cache, if cached
    cached: bool                # True: loaded from the cache, nothing was built
    target_desc: str            # the concrete target the kernels were built for
    sha256: str | None = None   # of the file at `path` (saving checks its copy against it)
    size: int | None = None
    tuned: bool = False         # built with a tuning log's specializations and kernels
    facts: dict | None = None   # the model info fields the library is bound to (`recorded_facts`)


def build(graph: Graph, target: str = "cpu", cache_dir: str | None = None, use_cache: bool = True,
          binding: str | None = None, tuning=None, backend: Backend | None = None) -> Built | None:
    """Build (or fetch from the compile cache) the kernels of every region of a partitioned `graph`.

    `binding` (a hex digest of the whole graph, from the pipeline), combined with the facts the model
    records about its kernels (`recorded_facts`: `Built.facts`) by `native.execution_binding`, is compiled
    into the library and is part of the cache key. A bad cache entry is discarded and rebuilt, and a cache
    folder that cannot be used (or is not this user's own) means an uncached build; both with a
    `cache.CacheWarning`.
    `tuning`: ``(tuning.TuningLog, specializations)`` to apply, see `build_executable`. `backend`: the target's,
    where the caller resolved it already (`backends.resolve`).
    Returns None when the graph has no region (nothing to compile).
    """
    backend = backend or resolve(target)
    graph_binding = binding
    regions = collect_regions(graph)
    if not regions:
        return None
    regions += mask_gathers(graph)
    check_compiler()
    tvm_target = backend.concrete_target(target)
    desc = str(tvm_target)
    loops = backend.loop_specs(graph)
    if loops and tuning is not None:        # a specialization of a loop body gets a compiled loop of its own
        loops += [(k, name, roles, outs, n_ys, dev) for k, region, roles, outs, n_ys, dev in list(loops)
                  for _, name in tuning[1].get(region, [])]
    facts = recorded_facts(backend, tvm_target, desc, tuning)
    binding = execution_binding(binding, execution_facts(backend.device, facts)) if binding is not None else None
    program = _program_spec(graph, backend, binding) if tuning is None else None
    extra = (binding or "") + (f"|loops:{loops!r}" if loops else "") + (f"|{PROGRAM_KEY}" if program else "") + \
        (f"|tuning:{tuning[0].digest()}:{tuning[1]!r}" if tuning is not None else "")
    key = _cache.cache_key(regions, desc, extra)
    cdir = _usable_cache_dir(cache_dir or _cache.default_cache_dir()) if use_cache else None
    if cdir is not None:
        hit = _cached(cdir, key, binding, backend, tvm_target)
        if hit is not None:
            stats.cache_hits += 1
            lib, entry = hit
            _count_tuned(facts, tuning, entry.tuned)
            return Built(lib, entry.path, True, desc, entry.sha256, entry.size, tuning is not None, facts)
    try:
        built = _build_elsewhere(backend, regions, tvm_target, binding, cdir, key, desc, facts, tuning, loops)
        if built is not None:
            built.facts = facts
        else:
            before = stats.tuned_kernels
            ex = build_executable(regions, backend, binding, tvm_target, loops, tuning, program)
            _count_tuned(facts, tuning, stats.tuned_kernels - before)
    except OSError as e:            # the build's own temporary files (CUDA), not the cache: a full $TMPDIR...
        import tempfile
        where = e.filename or tempfile.gettempdir()
        raise CompileError(f"compile: cannot write the build's temporary files in {where} ({e.strerror or e}); "
                           "$TMPDIR chooses the folder") from e
    except Exception as e:  # noqa: BLE001 - a tuning log is an optimization: never the reason a build fails
        if tuning is None:
            raise
        from .tuning import TuningWarning
        warnings.warn(f"dyntvm: tuning log {tuning[0].path} not applied: the build with it failed "
                      f"({type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}); using the default kernels",
                      TuningWarning, stacklevel=3)
        return build(graph, target, cache_dir, use_cache, graph_binding, backend=backend)
    if tuning is not None:
        from .tuning_trust import warn_refused
        tuning[0].warn_unscheduled()
        warn_refused(tuning[0])
    if built is not None:
        return built
    entry = _store(cdir, key, ex, binding, facts["tuning"]["kernels_tuned"] if tuning is not None else None)
    if entry is not None:           # run what a later hit loads: the stored library
        import tvm
        try:
            return Built(load_library(entry.path), entry.path, False, desc, entry.sha256, entry.size,
                         tuning is not None, facts)
        except Exception as e:  # noqa: BLE001 - e.g. the file was removed meanwhile: run the executable
            warnings.warn(f"dyntvm compile cache: cannot load {entry.path} just stored ({type(e).__name__}: {e}); "
                          "using the kernels built in memory", _cache.CacheWarning, stacklevel=3)
    return Built(ex, None, False, desc, tuned=tuning is not None, facts=facts)


NO_VM_PROGRAM = "DYNTVM_NO_VM_PROGRAM"        # "1": build no VM program (runtime/vm_program.py reads it too)
PROGRAM_KEY = "vm_program:5"                  # in the cache key of a library with a VM program (its version)


def _program_spec(graph: Graph, backend: Backend, prefix: str | None):
    """``(graph, key prefix)`` when the library gets a VM program (`vm_program`): libraries of a backend that
    takes one (`Backend.vm_program`: the CPU's) for graphs whose
    every node the program runs (`ir.vm_program.unsupported_nodes`), unless $DYNTVM_NO_VM_PROGRAM is 1 (and
    without a tuning log: the executor picks its specializations by size)."""
    from ..ir.vm_program import unsupported_nodes
    if not backend.vm_program or prefix is None or os.environ.get(NO_VM_PROGRAM) == "1" or unsupported_nodes(graph):
        return None
    return graph, prefix



def tuning_tasks(graph: Graph, hints: dict, tvm_target, origins: dict | None = None) -> tuple[dict, dict, dict]:
    """``(specializations, kernels, failed)`` of a partitioned `graph` for tuning (`tuning.tune`): the regions'
    specializations at the hinted sizes (`tuning.specialized_regions`), the static kernels of those and of
    the regions without symbolic dims, fused exactly as a build fuses them, and ``{specialization: why}``
    for those that do not build (each is built on its own). `origins`, when given, is filled with
    ``{kernel key: (region name, graph)}``: a region that calls the kernel (where a tuned one is compared)."""
    import tvm
    from tvm import relax

    from .relax_builder import build_module
    from .backends import backend_of
    from .tuning import plan_specializations, region_symbols, specialized_regions, static_kernels
    backend = backend_of(tvm_target)
    regions = collect_regions(graph) + mask_gathers(graph)
    table = plan_specializations(regions, hints)

    def fused(regs):
        m = build_module(regs, device_checks=backend.device_checks)
        with tvm_target:
            return m, tvm.transform.Sequential(backend.fuse_passes(tvm_target))(m)
    mod, whole = fused(regions)
    static = {gv.name_hint for gv, f in mod.functions_items()      # regions of static shapes: tuned as they are
              if isinstance(f, relax.Function) and not region_symbols(f)}
    kernels = static_kernels(whole, static) if static else {}
    if origins is not None:
        graphs = dict(regions)
        for region in sorted(static & graphs.keys()):
            for key in static_kernels(whole, {region}):
                origins.setdefault(key, (region, graphs[region]))
    kept, failed = {}, {}
    for region, specs in table.items():
        for combo, name in specs:
            try:
                # alone: fusion works per function, so its kernels are those of the full build
                spec = specialized_regions(regions, {region: [(combo, name)]})
                _, one = fused(spec)
            except Exception as e:  # noqa: BLE001 - a TVM pass failing on the bound sizes: skip that one
                failed[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"
                continue
            kept.setdefault(region, []).append((combo, name))
            for key, kernel in static_kernels(one, {name}).items():
                kernels.setdefault(key, kernel)
                if origins is not None:
                    origins.setdefault(key, spec[0])
    return kept, kernels, failed


def _usable_cache_dir(cdir: str) -> str | None:
    """`cdir` (created, mode 0700), or None when it cannot be created or is not this user's own: warned, the
    build goes on without the cache."""
    try:
        return _cache.private_folder(cdir)
    except OSError as e:
        warnings.warn(f"dyntvm compile cache: cannot use {cdir} ({type(e).__name__}: {e}); the kernels were "
                      "built without the cache", _cache.CacheWarning, stacklevel=4)
        return None


def _count_tuned(facts: dict, tuning, count: int | None) -> None:
    """Record in `facts` (a model's info) how many kernels were built with the tuning log's schedules: the
    log's winners whose workloads this model has and that were not refused (None: unknown, a cache entry
    that did not record it)."""
    if tuning is not None:
        facts["tuning"]["kernels_tuned"] = count


def _store(cdir, key, lib, binding, tuned: int | None = None):
    """The cache entry `lib` was stored as, or None (no cache; or it cannot be written: a CacheWarning). Never
    a library built after a Ctrl-C that a fallback took for a failing TVM call (`interrupts`)."""
    from .interrupts import check
    check()
    if cdir is None:
        return None
    try:
        return _cache.store(cdir, key, lib, binding, tuned)
    except OSError as e:
        warnings.warn(f"dyntvm compile cache: cannot write to {cdir} ({type(e).__name__}: {e}); the kernels were "
                      "built without the cache", _cache.CacheWarning, stacklevel=4)
        return None


def _build_elsewhere(backend: Backend, regions, tvm_target, binding, cdir, key, desc, facts, tuning=None,
                     loops=()) -> Built | None:
    """A backend building its library its own way (`Backend.build_library`; CUDA: device code on any machine,
    see `backends/cuda/gpu.py`, the library loaded only where a GPU is), stored in the cache; None where the
    backend builds with `build_executable` in this process alone."""
    before = stats.tuned_kernels
    made = backend.build_library(regions, tvm_target, binding, build_executable, tuning, loops)
    if made is None:
        return None
    lib, path, tuned_kernels = made
    if path is not None:                    # built in a child process (in this one, build_executable counts)
        stats.builds += 1
        stats.tuned_kernels += tuned_kernels
    tuned = tuning is not None
    _count_tuned(facts, tuning, stats.tuned_kernels - before)
    try:
        entry = _store(cdir, key, lib, binding, stats.tuned_kernels - before if tuned else None)
        if path is None:                                  # built in this process (a GPU host): runnable
            if entry is not None:
                return Built(load_library(entry.path), entry.path, False, desc, entry.sha256, entry.size,
                             tuned)
            return Built(lib, None, False, desc, tuned=tuned)
        if entry is not None:
            return Built(None, entry.path, False, desc, entry.sha256, entry.size, tuned)
        keep = os.path.join(_cache.uncached_dir(), f"{key}.so")       # uncached: a private copy to save from
        os.replace(path, keep)
        sha, size = _cache.file_digest(keep)
        return Built(None, keep, False, desc, sha, size, tuned)
    finally:
        if path is not None and os.path.exists(path):
            os.remove(path)


def _cached(cdir: str, key: str, binding: str | None, backend: Backend, tvm_target):
    """(loaded library, cache.Entry) of a sound cache entry, or None (a miss; a bad entry is discarded). The
    backend checks the library (`Backend.check_library`: a CUDA one must hold device code for its arch, checked
    on a GPU host too, before it is loaded); where its kernels cannot run here (CUDA kernels on a machine
    without a GPU), the entry is checked, not loaded."""
    try:
        entry = _cache.lookup(cdir, key, binding)
    except OSError as e:
        warnings.warn(f"dyntvm compile cache: cannot read {cdir} ({type(e).__name__}: {e}); building "
                      "without the cache", _cache.CacheWarning, stacklevel=4)
        return None
    if entry is None:
        return None
    why = shared_object_problem(entry.path)    # a truncated library (sidecar re-fixed) would crash dlopen
    if why is not None:
        _cache.discard(cdir, key, f"{_cache.LIBRARY} is not a loadable shared library: {why}")
        return None
    try:
        backend.check_library(entry.path, tvm_target)
    except CompileError as e:
        _cache.discard(cdir, key, str(e).replace("compile: ", ""))
        return None
    if not backend.runnable_here():
        return None, entry
    try:
        lib = load_library(entry.path)
    except Exception as e:  # noqa: BLE001 - TVM raises many kinds; all mean the entry is unusable
        _STALE_PATHS.add(entry.path)
        _cache.discard(cdir, key, f"cannot be loaded ({type(e).__name__}: {e})")
        return None
    if not lib.implements_function("vm_load_executable"):   # a shared library, but not a TVM executable
        _STALE_PATHS.add(entry.path)
        _cache.discard(cdir, key, f"{_cache.LIBRARY} is a shared library but not a TVM Relax executable")
        return None
    return lib, entry


# Cache paths whose library this process loaded and then discarded: dlopen matches a path it loaded before
# by name and hands back that library, so what is rebuilt at the same path is loaded from a private copy.
_STALE_PATHS: set = set()


def load_library(path: str):
    """tvm.runtime.load_module(path), from a private copy where the path is in `_STALE_PATHS`."""
    import os
    import shutil
    import tempfile

    import tvm
    if path not in _STALE_PATHS:
        return tvm.runtime.load_module(path)
    fd, private = tempfile.mkstemp(prefix="dyntvm-kernels-", suffix=".so")
    try:
        with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
            shutil.copyfileobj(src, out)
        return tvm.runtime.load_module(private)
    finally:
        os.remove(private)              # the loaded library stays mapped
