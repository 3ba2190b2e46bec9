"""Autotuning: MetaSchedule + its XGBoost cost model over a model's kernels, at hinted sizes.

MetaSchedule cannot tune kernels with symbolic dims, so tuning works on *specializations*: every region
whose symbols all have hints gets one copy per combination of hinted sizes (``<region>__at_T16_B1``, a
copy of the region's graph with its symbols bound), which legalization and fusion turn into static kernels. Each static kernel is one task:

1. our default schedule (`cpu_schedule`) is built and timed alone (random inputs, median);
2. MetaSchedule tunes the kernel (`trials` candidates, XGBoost cost model) into a JSON database; its
   candidates are measured here or, with a tracker (`tuning_rpc`), on the RPC servers behind it;
3. the best tuned schedule is timed alone the same way (for information), then kept only if the region it
   runs in, built with it in place and the rest default, is faster than with the default, timed interleaved
   in this process until the difference is outside the noise (`tuning_verdict`); otherwise the manifest
   records it as rejected, and why. Tuning never makes a region slower than our default.

The log folder (``tuning_logs/<model>/<target-key>/``) holds the MetaSchedule database
(``database_workload.json``, ``database_tuning_record.json``) and ``manifest.json``: the model's hash
(`runtime.artifact.kernel_binding`), the target (string, ISA features and core class it is matched by:
`tuning_keys`), the hints, the specializations per
region, and per kernel the default and tuned latency, which one is used and the verdict that chose. A task finished in the manifest
is not tuned again (an interrupted or repeated run resumes).

Applying a log (`load_log`, then `codegen.build` with ``tuning=``): the same specializations are compiled
next to the generic symbolic functions, their kernels scheduled with the tuned trace where the manifest says
it won; the executor dispatches each region call on its actual sizes (`runtime.executor`, the model's
``info["tuning"]["specialized"]``). A log that does not parse, or was made for another model or target,
warns and is ignored; its files are read as untrusted input (`log_files`). Ctrl-C during a tune is acted upon
at safe points only (`tuning_interrupt`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import os
import re
import time
import warnings
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax, tirx

from ..errors import CompileError
from .backends import backend_of
from .tuning_keys import cpu_model, log_mismatch, target_identity, target_key  # noqa: F401
from .tuning_task import TuningWarning, _as_main, _main_mod, _random_args, task_func, workload_key  # noqa: F401

FORMAT = 1
MANIFEST = "manifest.json"


# ------------------------------------------------------------------------------------ specializations
def region_symbols(func: relax.Function) -> list:
    """The symbolic dims of a region function's parameters, in order of first appearance (tir Vars)."""
    out = []
    for p in func.params:
        for v in relax.analysis.tir_vars_in_type(p.ty):
            if not any(v.same_as(w) for w in out):
                out.append(v)
    return out


def _suffix(combo: dict) -> str:
    return "__at_" + "_".join(f"{re.sub(r'[^A-Za-z0-9]', '', k) or 'd'}{v}" for k, v in combo.items())


def _input_symbols(graph) -> list:
    """The plain symbols of a region graph's input types, in order of first appearance."""
    out = []
    for v in graph.inputs:
        for d in v.type.shape:
            if isinstance(d, str) and d.isidentifier() and d not in out:
                out.append(d)
    return out


def plan_specializations(regions: list, hints: dict) -> dict:
    """``{region: [(combo, name), ...]}``: for each region ``(name, graph)`` whose symbols all have hints (and
    whose types use no other symbol), one specialization per combination of hinted sizes."""
    table = {}
    for region, graph in regions:
        names = _input_symbols(graph)
        every = set().union(*(v.type.symbols() for v in _all_values(graph)))
        if not names or not all(n in hints for n in names) or not every <= set(names):
            continue
        table[region] = [(dict(zip(names, vals)), region + _suffix(dict(zip(names, vals))))
                         for vals in itertools.product(*(hints[n] for n in names))]
    return table


def _all_nodes(graph):
    for n in graph.nodes:
        yield n
        for sub in n.subgraphs:
            yield from _all_nodes(sub)


def _all_values(graph):
    yield from graph.values()
    for n in graph.nodes:
        for sub in n.subgraphs:
            yield from _all_values(sub)


def specialized_regions(regions: list, table: dict) -> list:
    """``[(name, graph)]``: each specialization of `table` as a region graph of its own, a copy of the region's
    graph with its symbols bound in every value type, so that the region (its TE kernels too) is built for
    the fixed sizes. (Binding the symbols of the built Relax function instead left the TE kernels it calls
    symbolic, which TVM's FuseTIR refused.)"""
    import copy

    from ..ir.types import dim_symbols, eval_dim, map_type_dims
    graphs = dict(regions)
    out = []
    for region, specs in table.items():
        for combo, name in specs:
            g = copy.deepcopy(graphs[region])

            def bind(d, combo=combo):
                try:
                    return eval_dim(d, combo) if dim_symbols(d) <= combo.keys() else d
                except (KeyError, ValueError, TypeError):
                    return d
            for v in _all_values(g):
                v.type = map_type_dims(v.type, bind)
            for n in _all_nodes(g):         # dims in attrs: a reshape's target shape, an arange's stop
                if n.opdef.dim_attrs and dataclasses.is_dataclass(n.attrs):
                    n.attrs = n.opdef.map_dim_attrs(n.attrs, bind)
            out.append((name, g))
    return out


def static_kernels(mod: tvm.IRModule, callers: set) -> dict:
    """``{structural hash: (name, PrimFunc)}`` of the schedulable static kernels called by the Relax functions
    named in `callers` (a legalized, fused module)."""
    from .te_kernels import SERIAL_CHECK
    call_tir = tvm.ir.Op.get("relax.call_tir")
    names = set()
    for gv, func in mod.functions_items():
        if gv.name_hint in callers and isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, lambda e: names.add(e.args[0].name_hint)
                                            if isinstance(e, relax.Call) and e.op.same_as(call_tir) else None)
    out = {}
    for gv, func in mod.functions_items():
        if gv.name_hint not in names or not isinstance(func, tirx.PrimFunc):
            continue
        if func.attrs.get(SERIAL_CHECK, False) or relax.analysis.has_reshape_pattern(func):
            continue
        if any(not hasattr(p, "shape") or any(not isinstance(d, tirx.IntImm) for d in p.shape)
               for p in func.params):
            continue                            # symbolic or scalar parameters: not a tuning task
        out.setdefault(workload_key(func), (gv.name_hint, func))
    return out


# ---------------------------------------------------------------------------------------------- timing


def measure(func: tirx.PrimFunc, target, repeat: int = 20) -> float:
    """Median seconds of one call of a scheduled kernel (built alone for `target`, random inputs)."""
    with target:                                        # nvcc reads the arch from the current target
        lib = tvm.compile(_main_mod(func), target=target).jit()
    dev = backend_of(target).tuning_device()
    args = _random_args(func, dev)
    timer = lib.time_evaluator("main", dev, number=1, repeat=3, min_repeat_ms=20)
    timer(*args)                                            # warm up
    res = lib.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=5)(*args)
    return float(np.median(res.results))


# ------------------------------------------------------------------------------------------- the log
@dataclass
class TuningLog:
    """A tuning log folder, read: its manifest and MetaSchedule database."""
    path: str
    manifest: dict
    database: object = None
    _tuned: dict = field(default_factory=dict)
    unscheduled: set = field(default_factory=set)   # workload keys of winners the database has no record of
    rejected: dict = field(default_factory=dict)    # {database workload hash: why its best record is refused}
    refused: dict = field(default_factory=dict)     # {workload key: why its tuned kernel is refused}
    sha256: str = ""                                # of the files as read (`load_log`)

    @property
    def hints(self) -> dict:
        return self.manifest.get("hints", {})

    def digest(self) -> str:
        """Of the manifest and the database files as they were read: part of the compile cache key."""
        return self.sha256

    def winners(self) -> dict:
        """``{workload key: kernel entry}`` of the kernels whose tuned schedule beat the default."""
        return {k["workload"]: k for k in self.manifest.get("kernels", []) if k.get("use") == "tuned"}

    def tuned(self, func: tirx.PrimFunc, target):
        """The tuned schedule of `func` if the log has one that won, else None."""
        key = workload_key(func)
        if key not in self.winners():
            return None
        if key not in self._tuned:                  # a log is untrusted: checked, and run against the default
            from .tuning_trust import trusted_schedule
            self._tuned[key] = trusted_schedule(self, key, func, target)
        return self._tuned[key]

    def warn_unscheduled(self) -> None:
        """A TuningWarning naming the winners a build found no record of in the database (they kept the
        default schedules)."""
        if self.unscheduled:
            names = sorted(self.winners().get(k, {}).get("name", k) for k in self.unscheduled)
            n = len(names)
            warnings.warn(f"dyntvm: tuning log {self.path}: {n} kernel{'s' if n > 1 else ''} it marks as tuned "
                          f"{'have' if n > 1 else 'has'} no record in its database ({', '.join(names)}): built with "
                          "the default schedules", TuningWarning, stacklevel=4)


def _valid_specialized(table) -> bool:
    """Whether a manifest's ``specialized`` is ``{region: [[{symbol: size >= 0}, function name], ...]}``."""
    def size(v):
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2 ** 62
    return isinstance(table, dict) and all(
        isinstance(r, str) and isinstance(specs, list) and all(
            isinstance(e, list) and len(e) == 2 and isinstance(e[0], dict) and e[0] and isinstance(e[1], str)
            and all(isinstance(k, str) and size(v) for k, v in e[0].items()) for e in specs)
        for r, specs in table.items())


def load_log(path: str, model_hash: str | None, target, quiet_mismatch: bool = False) -> TuningLog | None:
    """Read the log in `path` for a model (`model_hash`; None: any) and `target`; None, with a TuningWarning
    naming the reason, when it cannot be applied (`quiet_mismatch`: no warning when it is a sound log of
    another model or target). Its files are untrusted input (`log_files`)."""
    from .log_files import MAX_MANIFEST_BYTES, LogFileError, parse_json, read_database_files, \
        read_regular_file

    def refuse(why: str):
        warnings.warn(f"dyntvm: tuning log {path} not applied: {why}; using the default kernels", TuningWarning,
                      stacklevel=3)
        return None
    if not os.path.isdir(path):
        return refuse("no such folder")
    try:
        mpath = os.path.join(path, MANIFEST)
        manifest_bytes = read_regular_file(mpath, MAX_MANIFEST_BYTES)
        manifest = parse_json(manifest_bytes, mpath)
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or \
                not isinstance(manifest.get("kernels"), list) or not isinstance(manifest.get("hints"), dict):
            raise ValueError("not a dyntvm tuning manifest")
        if not _valid_specialized(manifest.get("specialized", {})):
            raise ValueError("its 'specialized' is not {region: [[{symbol: size}, function name], ...]}")
        if not all(isinstance(k, dict) and isinstance(k.get("workload"), str) for k in manifest["kernels"]):
            raise ValueError("its 'kernels' are not entries with a 'workload'")
    except ValueError as e:                                 # LogFileError too
        return refuse(f"{MANIFEST} is missing or corrupt ({type(e).__name__}: {e})")
    mismatch = log_mismatch(manifest, target)
    if mismatch is not None:
        mismatch = f"it was made for another target: {mismatch}"
    elif model_hash is not None and manifest.get("model_hash") != model_hash:
        mismatch = f"it was made for another model (or this model changed since): {manifest.get('model')!r}"
    if mismatch:
        return None if quiet_mismatch else refuse(mismatch)
    try:
        files = read_database_files(path)
    except LogFileError as e:
        return refuse(f"its MetaSchedule database is refused ({e})")
    try:
        from .tuning_trust import load_checked_database
        db, rejected = load_checked_database(path, files)   # bounded, and only records that pass the allow-list
    except Exception as e:  # noqa: BLE001 - TVM raises various errors on bad records
        return refuse(f"its MetaSchedule database does not load ({type(e).__name__}: {_first_line(e)})")
    digest = hashlib.sha256(manifest_bytes)
    for data in files.values():
        digest.update(hashlib.sha256(data).digest())
    return TuningLog(path, manifest, db, rejected=rejected, sha256=digest.hexdigest())


def write_manifest(path: str, manifest: dict) -> None:
    """Atomically: a reader sees the old or the new manifest. The temporary file is a new one (O_EXCL), never
    whatever a fixed name holds (a FIFO would block the open, a symlink redirect the write)."""
    import secrets
    tmp = os.path.join(path, f"{MANIFEST}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
        os.replace(tmp, os.path.join(path, MANIFEST))
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


# ------------------------------------------------------------------------------------------ tuning
def _build(mod, target, _params):
    """MetaSchedule's builder function without its ``import tvm.s_tir.tensor_intrin`` (25 s in each fresh
    worker here: it parses every target's tensor intrinsics; fp32 CPU kernels use none)."""
    from tvm.driver import build as tvm_build
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock
    return tvm_build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


@contextlib.contextmanager
def _meta_schedule_logging():
    """MetaSchedule's logging around one tune: its console handler takes its level from its logger (WARNING:
    the progress bar is the console's; its files in log_dir/logs keep everything), and handlers that others
    put on that logger are set aside meanwhile: MetaSchedule re-configures the logger with `dictConfig` by
    handler name, which fails on a handler without one (pytest's, a user's: "'NoneType' object has no
    attribute 'format'")."""
    name = "tvm.s_tir.meta_schedule"
    logger = logging.getLogger(name)
    level = logger.level
    foreign = [h for h in logger.handlers if not (h.get_name() or "").startswith(name)]
    for h in foreign:
        logger.removeHandler(h)
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for h in foreign:
            logger.addHandler(h)
        logger.setLevel(level)


def tune_kernels(kernels: dict, target, log_dir: str, manifest: dict, trials: int, progress=None,
                 on_done=None, regions: dict | None = None, rpc: tuple | None = None, stop=None) -> dict:
    """Tune each kernel of `kernels` (``static_kernels``) not yet finished in `manifest`, into the database in
    `log_dir`; updates and writes the manifest after each kernel. `progress`: a tqdm-like bar (``update``,
    ``set_postfix_str``). `regions`: ``{workload key: (region name, graph)}``, the region each kernel is
    compared in (`tuning_verdict`). `rpc`: ``(host, port, key)`` of a TVM RPC tracker whose servers measure
    the candidates (`tuning_rpc`) instead of this machine. Returns the manifest. Ctrl-C stops at the next safe
    point (`tuning_interrupt`): the manifest and database keep what was finished and measured, then
    KeyboardInterrupt is raised. `stop`: the `StopRequest` of a `deferred_interrupt` the caller entered
    already (a second one inside it would never be set), else the tune defers Ctrl-C itself."""
    done = {k["workload"]: k for k in manifest["kernels"] if k.get("status") in ("done", "failed")}
    todo = [(key, name, func) for key, (name, func) in kernels.items() if key not in done]
    if progress is not None:
        progress.update(len(kernels) - len(todo))
    if not todo:
        return manifest
    backend = backend_of(target)
    workers = backend.prepare_tuning(target)
    schedule = lambda func, name: backend.default_schedule(func, target, name)  # noqa: E731 - a build's schedule
    from .tuning_interrupt import StoppableBuilder, StoppableRunner, deferred_interrupt
    deferral = contextlib.nullcontext(stop) if stop is not None else deferred_interrupt()
    with deferral as stop:                  # Ctrl-C: acted upon at safe points (`tuning_interrupt`)
        builder = StoppableBuilder(stop, max_workers=workers, f_build=_build, timeout_sec=120)
        if rpc is None:
            runner = StoppableRunner(stop)
        else:
            from .tuning_rpc import rpc_runner
            runner = rpc_runner(stop, *rpc)
        try:
            _tune_each(todo, target, log_dir, manifest, trials, schedule, (builder, runner), stop, progress, on_done,
                       regions or {})
        finally:
            runner.close()
    return manifest


@contextlib.contextmanager
def _cpu_tensor_intrinsics_only(target):
    """MetaSchedule's TuneContext imports ``tvm.s_tir.tensor_intrin``, which parses every target's intrinsics
    (CUDA, ROCm, Hexagon, ...: 25 s idle, minutes on a loaded machine, mostly in TVMScript's `inspect.stack`).
    For a CPU tune only the CPU ones (x86's VNNI / AVX-512 dots, Arm's) can be used: those are imported, the
    package stands in for the rest meanwhile (its real ``__init__`` still runs on a later import)."""
    import importlib
    import sys
    import types
    name = "tvm.s_tir.tensor_intrin"
    wanted = backend_of(target).tensor_intrinsics
    if wanted is None or name in sys.modules:
        yield
        return
    import tvm.s_tir
    stub = types.ModuleType(name)
    stub.__path__ = [os.path.join(os.path.dirname(tvm.s_tir.__file__), "tensor_intrin")]
    sys.modules[name] = stub
    try:
        for cpu in wanted:
            importlib.import_module(f"{name}.{cpu}")
        yield
    finally:
        if sys.modules.get(name) is stub:
            del sys.modules[name]


def search(task, target, log_dir: str, db, trials: int, measurers, stop):
    """MetaSchedule's search of `task` (a module of one ``main``) into `db`; the best schedule's PrimFunc, or
    a CompileError when no candidate was valid."""
    from tvm.s_tir import meta_schedule as ms

    from .tuning_interrupt import MeasuredOnly, StoppableRoundRobin
    builder, runner = measurers
    with warnings.catch_warnings(), _meta_schedule_logging(), _cpu_tensor_intrinsics_only(target):
        warnings.simplefilter("ignore")
        ms.tune_tir(task, target, log_dir, max_trials_global=trials, num_trials_per_iter=min(trials, 64),
                    builder=builder, runner=runner, database=db, cost_model="xgb", seed=0,
                    task_scheduler=StoppableRoundRobin(stop), measure_callbacks=[MeasuredOnly(stop)])
    stop.check()                            # interrupted: what was measured is in the database, not finished
    sch = db.query_schedule(task, target=target, workload_name="main")
    if sch is None:
        raise CompileError("no valid candidate was found")
    return sch.mod["main"]


def _first_line(e: BaseException) -> str:
    lines = str(e).strip().splitlines()
    return lines[0][:200] if lines else "(no message)"


def _tune_each(todo, target, log_dir, manifest, trials, schedule, measurers, stop, progress, on_done,
               regions) -> None:
    """`tune_kernels`' loop over the kernels to tune; `stop.check()` at its safe points."""
    from tvm.s_tir import meta_schedule as ms

    from .tuning_verdict import keep_or_reject
    db = ms.database.JSONDatabase(work_dir=log_dir)
    for key, name, func in todo:
        stop.check()
        entry = {"workload": key, "name": name, "trials": trials}
        t0 = time.perf_counter()
        try:
            default = schedule(func, name)
            entry["default_us"] = round(measure(default, target) * 1e6, 3)
            stop.check()
        except Exception as e:  # noqa: BLE001 - our schedule cannot be timed alone: nothing to compare with
            entry.update(status="failed", reason=f"default schedule: {type(e).__name__}: {str(e)[:200]}")
            default = None
        if default is not None:
            try:
                tuned = search(_main_mod(task_func(func)), target, log_dir, db, trials, measurers, stop)
                entry["tuned_us"] = round(measure(tuned, target) * 1e6, 3)      # alone: for information
                stop.check()
                verdict = keep_or_reject(key, default, tuned, target, regions.get(key))
                entry.update(use=verdict.use, status="done", verdict=verdict.record())
                if verdict.use != "tuned":
                    entry["rejected"] = verdict.reason
                stop.check()
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: BLE001 - MetaSchedule fails on some kernels: keep the default
                import traceback
                entry.update(status="failed", use="default",
                             reason=f"tuning: {type(e).__name__}: {_first_line(e)}",
                             where=[f"{f.filename}:{f.lineno} {f.name}"
                                    for f in traceback.extract_tb(e.__traceback__)[-4:]])
        entry["seconds"] = round(time.perf_counter() - t0, 1)
        manifest["kernels"] = [k for k in manifest["kernels"] if k["workload"] != key] + [entry]
        write_manifest(log_dir, manifest)
        if progress is not None:
            progress.update(1)
            progress.set_postfix_str(f"{name}: default {entry.get('default_us', '-')} us, tuned "
                                     f"{entry.get('tuned_us', '-')} us, {entry.get('use', '-')}")
        if on_done is not None:
            on_done(entry)
