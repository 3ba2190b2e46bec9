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

import contextlib
import os
import threading
import time

import numpy as np

from .codegen.backends import resolve
from .codegen.build import build
from .codegen.cache import is_uncached
from .codegen.shared_regions import share_identical_regions
from .errors import CompileError, InputError
from .frontend.autograph import convert
from .frontend.tracer import TensorSpec, trace
from .ir.graph import Graph
from .ir.tree import tree_flatten, tree_unflatten
from .partition import partition
from .runtime.artifact import kernel_binding
from .runtime.fold import fold_constants
from .runtime.model import CompiledModel, virtual_machine
from .runtime.torch_inputs import is_torch_tensor, torch_to_numpy


# TVM's Relax BlockBuilder keeps one stack for the process: builds from several threads (e.g. a hybridized
# function called from threads) take turns. Tracing and partitioning need no lock.
_BUILD_LOCK = threading.Lock()


def partition_graph(graph: Graph, selector=None) -> Graph:
    """The graph `compile` builds: partitioned into regions, input-less regions folded to constants, equal
    regions sharing one function (`codegen.shared_regions`)."""
    pg = fold_constants(partition(graph, selector))
    share_identical_regions(pg)
    return pg


def compile(fn_or_graph, *specs, target: str = "cpu", selector=None, cache_dir: str | None = None,
            use_cache: bool = True, tuning_log: str | None = None, autograph: bool = False) -> CompiledModel:
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
        tuning_log: a folder written by `dt.tune` / `dyntvm tune`: the regions are also compiled for its
            hinted sizes, with its tuned kernels where they won, and each call picks the build for its sizes.
            A log for another model or target, or a corrupt one, warns and is not applied. Without it, a log
            for this model and target under the shipped ``tuning_logs/`` (or $DYNTVM_TUNING_LOGS) is used.
        autograph: convert the function's Python `if` / `for` / `while` on traced tensors to `F.cond` /
            `F.foreach` / `F.while_loop` first (`dt.autograph`; `dt.show_converted` shows the result).

    Example:
        >>> model = dt.compile(lambda x: F.tanh(x) * 2, dt.TensorSpec(("N", 4)))
        >>> model(np.ones((3, 4), "float32")).shape
        (3, 4)
    """
    backend = resolve(target)           # once: codegen gets the backend's hooks from here on
    t0 = time.perf_counter()
    if isinstance(fn_or_graph, Graph):
        if specs:
            raise CompileError("compile: specs are only for a function; this graph is already traced")
        graph = fn_or_graph
    elif callable(fn_or_graph):
        graph = trace(convert(fn_or_graph) if autograph else fn_or_graph, *specs)
    else:
        raise CompileError(f"compile: expected a function or a dt.Graph, got {type(fn_or_graph).__name__}")
    from .partition import cond_select
    with (cond_select.off() if not backend.selects_conds else contextlib.nullcontext()):
        pg = partition_graph(graph, selector)
    # the kernels carry a digest of the regions they implement; `dt.load` checks it against graph.json
    binding = kernel_binding(pg) if any(n.op == "region" for n in pg.walk()) else None
    tuning = _tuning_for(pg, graph.name, binding, target, backend, tuning_log) if binding else None
    if tuning_log is not None and not binding:
        import warnings

        from .codegen.tuning import TuningWarning
        warnings.warn(f"dyntvm: tuning log {tuning_log} not applied: the model has no compiled region",
                      TuningWarning, stacklevel=2)
    from .codegen.interrupts import noted_interrupt
    with _BUILD_LOCK, noted_interrupt():     # a Ctrl-C a fallback took for a failing TVM call: KeyboardInterrupt
        built = build(pg, target, cache_dir, use_cache, binding=binding, tuning=tuning, backend=backend)
    vm = virtual_machine(built.lib, backend.device) if built and built.lib is not None else None
    info = {"compile_time_s": round(time.perf_counter() - t0, 3),
            "cache": "hit" if built and built.cached else "miss"}
    if built:       # built_for, cpu_features / cuda_arch, tuning.specialized: the library is bound to them
        facts = dict(built.facts)
        if "tuning" in facts:
            log = tuning[0]
            facts["tuning"] = {"log": os.path.abspath(log.path), **facts["tuning"]}
        info.update(facts)
    model = CompiledModel(pg, vm, backend.device, built.lib if built else None, info)
    model.lib_path = built.path if built else None
    model.lib_sha256 = built.sha256 if built else None
    if built and built.path:        # `save` writes these bytes: the cache entry may be removed meanwhile
        with open(built.path, "rb") as f:
            model.lib_bytes = f.read()
        if is_uncached(built.path):            # a private copy (uncached CUDA build without a GPU): not kept
            os.remove(built.path)
            model.lib_path = None
    return model


def shipped_logs() -> str:
    """The folder of shipped tuning logs: $DYNTVM_TUNING_LOGS, else ``tuning_logs/`` next to the package."""
    return os.environ.get("DYNTVM_TUNING_LOGS") or os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tuning_logs")


def _tuning_for(pg: Graph, name: str, binding: str, target: str, backend, tuning_log):
    """``(TuningLog, specializations)`` to build with, or None (no log, or one that does not apply: warned)."""
    from .codegen.build import check_compiler
    check_compiler()                            # TVM's compiler library (runtime-only: a clear CompileError)
    from .codegen.tuning import load_log
    tvm_target = backend.concrete_target(target)
    if tuning_log is None:                      # a shipped log for this model and target, if any: silently
        log = _shipped_log(os.path.join(shipped_logs(), name), binding, tvm_target)
    else:
        if not isinstance(tuning_log, (str, os.PathLike)):
            raise CompileError(f"compile: tuning_log must be a folder path, got {type(tuning_log).__name__}")
        log = load_log(os.fspath(tuning_log), binding, tvm_target)
    if log is None:
        return None
    table = {r: [(dict(combo), n) for combo, n in specs] for r, specs in log.manifest.get("specialized", {}).items()}
    return log, table


def _shipped_log(folder: str, binding: str, tvm_target):
    """The first log under `folder` (``tuning_logs/<model>``) that applies to this model and target: the one
    named by this target's key first, then the others (a log matches by ISA features and core class, not by
    its folder's name: `codegen/tuning_keys.py`). A bad file warns; another model or CPU says nothing."""
    from .codegen.tuning import load_log, target_key
    try:
        names = sorted(e.name for e in os.scandir(folder) if e.is_dir())
    except OSError:
        return None
    key = target_key(tvm_target)
    for name in sorted(names, key=lambda n: n != key):
        if name.partition("-")[0] != key.partition("-")[0]:      # a CUDA log for a CPU build: not read
            continue
        path = os.path.join(folder, name)
        if os.path.lexists(os.path.join(path, "manifest.json")):
            log = load_log(path, binding, tvm_target, quiet_mismatch=True)
            if log is not None:
                return log
    return None


def tune(fn_or_graph, *specs, target: str = "cpu", trials: int = 64, shape_hints: dict | None = None,
         log_dir: str | None = None, selector=None, progress: bool = True, rpc: str | None = None,
         rpc_key: str | None = None, busy_load: float | None = None, refuse_busy: bool = False) -> str:
    """Autotune a model's kernels with MetaSchedule and its XGBoost cost model; returns the log folder.

    Every region whose symbolic dims all have hints is specialized to each combination of hinted sizes;
    each resulting static kernel is tuned (`trials` candidates), and the tuned schedule kept only if the
    region it runs in is faster with it than with our default schedule, timed interleaved until the
    difference is outside the noise (`codegen/tuning_verdict.py`); else the log records it as rejected. Running
    again with the same folder resumes: finished kernels are not tuned again. Ctrl-C stops at the next safe
    point (builds in progress are dropped, a measurement in progress finishes), keeps what was finished and
    measured, and raises KeyboardInterrupt.

    Args:
        fn_or_graph, *specs, selector: as for `compile`.
        target: "cpu", or "cuda" (needs a GPU: MetaSchedule times its candidates on it; the baseline is
            dlight's default GPU schedules, as a CUDA build uses them).
        trials: MetaSchedule candidates measured per kernel.
        shape_hints: ``{symbol: [sizes]}``, e.g. ``{"T": [16, 64], "B": [1, 16]}``; default: 16 for every
            symbol of the inputs.
        log_dir: default ``tuning_logs/<model name>/<target key>`` under the current folder.
        progress: show a progress bar (kernels done, the last one's default and tuned latency).
        rpc, rpc_key: ``"HOST:PORT"`` of a TVM RPC tracker and the key its servers registered under: they
            measure MetaSchedule's candidates (`codegen/tuning_rpc.py`); CPU only.
        busy_load: the 1-minute load average per core above which the machine counts as busy (default
            $DYNTVM_TUNE_BUSY_LOAD, else 0.5): a busy machine warns (`TuningWarning`), or, with
            `refuse_busy`, refuses the tune (CompileError).

    Example:
        >>> log = dt.tune(lstm, *specs, trials=32, shape_hints={"T": [64], "B": [1, 16]})
        >>> model = dt.compile(lstm, *specs, tuning_log=log)
    """
    from .codegen.build import tuning_tasks
    from .codegen.log_files import create_database_files
    from .codegen.tuning import FORMAT, target_identity, target_key, tune_kernels, write_manifest
    from .codegen.tuning_interrupt import deferred_interrupt
    from .codegen.tuning_verdict import busy_load as load_limit
    from .codegen.tuning_verdict import check_load
    backend = resolve(target)
    if not isinstance(trials, int) or isinstance(trials, bool) or trials < 1:
        raise CompileError(f"tune: trials must be a positive int, got {trials!r}")
    load = check_load(load_limit(busy_load), refuse_busy)        # before any work of ours loads the machine
    remote = None
    if rpc is not None:
        if not backend.rpc_tuning:
            raise CompileError(f"tune: rpc= (--rpc) tunes CPU kernels on the tracker's servers, not {target!r}")
        from .codegen.tuning_rpc import check_rpc
        remote = check_rpc(rpc, rpc_key)
    elif rpc_key is not None:
        raise CompileError("tune: rpc_key (--key) is the servers' key at a tracker: give the tracker too (--rpc)")
    if isinstance(fn_or_graph, Graph):
        graph = fn_or_graph
    elif callable(fn_or_graph):
        graph = trace(fn_or_graph, *specs)
    else:
        raise CompileError(f"tune: expected a function or a dt.Graph, got {type(fn_or_graph).__name__}")
    from .ir.list_type import value_dims
    symbols = sorted({d for v in graph.inputs for d in value_dims(v.type) if isinstance(d, str) and d.isidentifier()})
    hints = _check_hints(shape_hints, symbols)
    from .partition import cond_select
    with (cond_select.off() if not resolve(target).selects_conds else contextlib.nullcontext()):
        pg = partition_graph(graph, selector)     # as `compile` partitions it for this target
    if not any(n.op == "region" for n in pg.walk()):
        raise CompileError("tune: the model has no compiled region: nothing to tune")
    binding = kernel_binding(pg)
    tvm_target = backend.tuning_target(target, backend.concrete_target(target))
    log_dir = os.fspath(log_dir) if log_dir is not None else \
        os.path.join("tuning_logs", graph.name, target_key(tvm_target))
    with _BUILD_LOCK, deferred_interrupt():     # Ctrl-C in TVM's (Python) passes: KeyboardInterrupt after them
        origins: dict = {}
        table, kernels, failed = tuning_tasks(pg, hints, tvm_target, origins)
    if not kernels:
        _warn_nothing_to_tune(pg, hints)
    manifest = {"format": FORMAT, "model": graph.name, "model_hash": binding, **target_identity(tvm_target),
                "hints": hints, "specialized": {r: [[c, n] for c, n in specs] for r, specs in table.items()},
                "not_specialized": failed, "kernels": []}
    manifest["tuned_under"] = {**load,
                               "runner": f"rpc {remote[0]}:{remote[1]} key {remote[2]} ({remote[3]} servers)"
                               if remote else "local"}
    try:
        os.makedirs(log_dir, exist_ok=True)
    except OSError as e:
        raise CompileError(f"tune: cannot write the log folder {log_dir} ({type(e).__name__}: {e})") from None
    with _log_lock(log_dir):
        try:
            # Ctrl-C sets a flag from here on, before the manifest exists (`tuning_interrupt`): a
            # KeyboardInterrupt raised in the imports and set-up before the tune's own safe points could be
            # swallowed there (a Ctrl-C right after the manifest was written once let the tune finish, exit 0)
            with deferred_interrupt() as stop:
                manifest["kernels"] = _kernels_to_resume(log_dir, manifest)
                from .codegen.tuning_trust import check_database_to_resume
                check_database_to_resume(log_dir)           # its records seed the search: built and run
                try:
                    write_manifest(log_dir, manifest)
                    create_database_files(log_dir)
                except OSError as e:
                    raise CompileError(f"tune: cannot write the log folder {log_dir} ({type(e).__name__}: {e})") \
                        from None
                from tqdm.auto import tqdm
                with tqdm(total=len(kernels), desc=f"tuning {graph.name}", unit="kernel", disable=not progress) \
                        as bar, _BUILD_LOCK:
                    tune_kernels(kernels, tvm_target, log_dir, manifest, trials, progress=bar, regions=origins,
                                 rpc=remote, stop=stop)
        except KeyboardInterrupt:     # raised at a safe point of `tune_kernels`, or as the deferral ends
            print(f"dyntvm tune: interrupted; what was tuned is kept in {log_dir} (run again to resume)")
            raise
    return log_dir


def _kernels_to_resume(log_dir: str, manifest: dict) -> list:
    """The kernel entries of the log already in `log_dir` (none if there is none), which must be a log of the
    same model, target and hints as `manifest`, in files a tune can read and append to (`log_files`)."""
    from .codegen.log_files import LogFileError, check_folder_to_resume, read_json
    from .codegen.tuning import MANIFEST
    mpath = os.path.join(log_dir, MANIFEST)
    try:
        check_folder_to_resume(log_dir)
    except LogFileError as e:
        raise CompileError(f"tune: cannot resume the log in {log_dir}: {e}; remove it or pick another "
                           "log_dir") from None
    if not os.path.lexists(mpath):
        return []
    try:
        old = read_json(mpath)
        if not isinstance(old, dict):
            raise ValueError(f"a JSON {type(old).__name__}, not a dyntvm tuning manifest")
    except ValueError as e:                         # LogFileError too
        raise CompileError(f"tune: {mpath} exists but is not readable ({type(e).__name__}: {e}); remove it or "
                           "pick another log_dir") from None
    fields = ("model_hash", "target_key", "isa", "core_class", "hints")
    same = {k: old.get(k) for k in fields} == {k: manifest.get(k) for k in fields}
    if not same:
        raise CompileError(f"tune: {log_dir} holds a log of another model, target or hints "
                           f"({old.get('model')!r}, {old.get('target_key')}, hints {old.get('hints')}); pick "
                           "another log_dir")
    return [k for k in old.get("kernels", []) if isinstance(k, dict) and "workload" in k]


@contextlib.contextmanager
def _log_lock(log_dir: str):
    """Holds an exclusive lock on a log folder for one tune: two tunes into the same folder would interleave
    their manifests and databases. A second one is refused at once (the lock goes with its process)."""
    try:
        import fcntl
    except ImportError:                         # not POSIX: no lock
        yield
        return
    import stat
    path = os.path.join(log_dir, ".lock")
    try:                                        # non-blocking: a FIFO there would block a plain open
        f = os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC), "a")
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            f.close()
            raise OSError(f"{path} is not a regular file")
    except OSError as e:
        raise CompileError(f"tune: cannot write the log folder {log_dir} ({type(e).__name__}: {e})") from None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise CompileError(f"tune: another dyntvm tune is writing {log_dir} (its lock {path} is held); wait for "
                               "it or pick another log_dir") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _warn_nothing_to_tune(pg, hints: dict) -> None:
    """A TuningWarning saying why no kernel of `pg` is tuned (a region's dims made by a dynamic-shape op)."""
    import warnings

    from .codegen.build import collect_regions
    from .codegen.tuning import TuningWarning, _all_values
    why = []
    for name, g in collect_regions(pg):
        syms = sorted(set().union(*(v.type.symbols() for v in _all_values(g))) - set(hints))
        if syms:
            why.append(f"{name} uses {', '.join(syms)}")
    warnings.warn(TuningWarning(
        "tune: no kernel to tune: a region is tuned only at sizes that fix every symbolic dim it uses, and only "
        "the model's input dims can be hinted (" + ("; ".join(why) or "no region") + "; a dim such as _d0 is a "
        "size made at run time by a dynamic-shape op such as boolean_mask). The log records no kernel."),
        stacklevel=3)


def _check_hints(hints, symbols: list) -> dict:
    if hints is None:
        return {s: [16] for s in symbols}
    if not isinstance(hints, dict):
        raise CompileError(f"tune: shape_hints must be a dict {{symbol: [sizes]}}, got {type(hints).__name__}")
    out = {}
    for k, v in hints.items():
        if k not in symbols:
            raise CompileError(f"tune: shape_hints names {k!r}, which is not a symbolic dim of the model's inputs "
                               f"(those are: {', '.join(symbols) or 'none'})")
        vals = [v] if isinstance(v, (int, np.integer)) else v
        if not isinstance(vals, (list, tuple)) or not vals or not all(
                isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 1 for x in vals):
            raise CompileError(f"tune: shape_hints[{k!r}] must be sizes >= 1 (an int or a list of ints), got {v!r}")
        out[k] = sorted({int(x) for x in vals})
    return out


def _check_dynamic(dynamic) -> None:
    """`hybridize`'s ``dynamic``: "all", or a sequence with, per input, "all" or a sequence of axis names (a
    symbol, or None: the call's size); a CompileError naming what is wrong otherwise (not a TypeError later)."""
    if isinstance(dynamic, str) and dynamic == "all":
        return
    if not isinstance(dynamic, (tuple, list)):
        raise CompileError(f"hybridize: dynamic must be 'all' or a tuple with one entry per input, got {dynamic!r}")
    for i, names in enumerate(dynamic):
        if isinstance(names, str) and names == "all":
            continue
        if not isinstance(names, (tuple, list)) or \
                not all(a is None or isinstance(a, (str, int)) and not isinstance(a, bool) for a in names):
            raise CompileError(f"hybridize: dynamic[{i}] must be 'all' or a tuple with a symbol name (or None: the "
                               f"call's size) per axis of input {i}, got {names!r}")


def hybridize(fn, target: str = "cpu", dynamic=(), selector=None, cache_dir=None, autograph: bool = False):
    """Compile `fn` on first call and cache per input signature (MXNet's hybridize).

    The signature of a call is the dtype and rank of every input, plus the size of every axis not
    named dynamic. `dynamic` gives, per argument, a tuple with a symbol name for each axis that stays
    symbolic (None: specialize to the call's size); ``dynamic="all"`` keeps every axis symbolic.
    ``autograph=True`` converts Python control flow on tensors, as for `compile`.

    Example:
        >>> fast = dt.hybridize(lstm, dynamic=(("T", "B", None), ("B", None), ("B", None)))
        >>> hs, h = fast(xs, h0, c0)     # one compile serves every T and B
    """
    _check_dynamic(dynamic)
    compiled: dict = {}
    is_leaf = lambda x: isinstance(x, np.ndarray)

    def specs_for(args):
        leaves, spec = tree_flatten(list(args), is_leaf=is_leaf)
        specs = []
        for i, x in enumerate(leaves):
            x = torch_to_numpy(x, f"input {i}") if is_torch_tensor(x) else np.asarray(x)
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
                                            cache_dir=cache_dir, autograph=autograph)
        return model(*args)

    call.compiled = compiled
    call.__wrapped__ = fn
    call.__name__ = getattr(fn, "__name__", "hybridized")
    return call
