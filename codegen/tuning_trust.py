"""A tuning log is untrusted input: what it may make a build do.

A MetaSchedule record is a trace of schedule primitives, and some primitives and annotations do more than
reorder a kernel's loops: ``Annotate(loop, "pragma_import_llvm", ir)`` links LLVM IR of the log's choosing
into the library (its ``.init_array`` runs when the library loads: at build, and in every saved artifact at
`dt.load`), ``Split(..., disable_predication=True)`` drops the bounds check of an imperfect split (writes out
of bounds), ``pragma_auto_unroll_max_step`` of a billion unrolls until the build runs out of memory, and
``UnsafeSetDType`` silently changes results. So a log is applied only through these checks, on every path
(`dt.compile(tuning_log=)`, ``dyntvm compile --tuning-log``, shipped logs and $DYNTVM_TUNING_LOGS, the CUDA
build child):

1. Reading (`load_checked_database`): regular files of bounded size, a bounded number of workloads and
   records, traces of bounded length; of each workload's records only the best (the one MetaSchedule's
   query would pick) is kept, and MetaSchedule's `JSONDatabase` loads a copy holding only those that pass
   step 2 (it replays every trace as it loads).
2. Statically (`trace_problem`): every instruction is one MetaSchedule's own search space produces for our
   kernels (`ALLOWED_KINDS`: its LLVM and CUDA rules and postprocessors, as in the shipped logs), every
   annotation key is one of `ANNOTATIONS` with its value in bounds, no split disables predication.
3. While the trace is replayed on the kernel (`replay_checked`): split factors multiply to the loop's extent,
   vectorized and thread-bound extents and sampled annotation values are in bounds, the kernel's parameters
   keep their types.
4. Numerically (`verify_tuned`): the tuned kernel and the default kernel run on the same random inputs;
   any difference beyond float rounding (integers: any) refuses it. CUDA kernels run only where a GPU is
   (a CUDA build without one gets steps 1-3).

A refused record costs only its kernel: the default schedule is used, with a `TuningWarning` naming the
kernel and the reason. A tune resuming in a folder (`check_database_to_resume`) refuses a database holding
any record that fails step 2: MetaSchedule builds and runs the records it finds there. What a log is trusted for: choosing among schedules MetaSchedule itself could have
chosen; nothing else.
"""
from __future__ import annotations

import json
import math
import os
import re
import warnings

import numpy as np

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"

# ------------------------------------------------------------------------------------------- bounds
# The shipped logs (tuning_logs/, 5 models, CPU and CUDA): files up to 1 MB, 1360 records, traces of up to 95
# instructions, unroll steps up to 1024, vectorized loops of 64 (CPU) and 4 (CUDA cooperative fetch).
MAX_FILE_BYTES = 64 << 20       # each database file (a tune of 200 kernels x 64 trials: ~20 MB)
MAX_WORKLOADS = 20_000
MAX_RECORDS = 200_000           # parsed in Python; only the best per workload reaches TVM
MAX_TRACE_INSTRUCTIONS = 2_000
MAX_NAME = 256                  # block names, scopes, random variable names
MAX_UNROLL = 1024               # MetaSchedule's largest unroll_max_steps (CUDA)
MAX_VECTOR_LANES = 1024         # MetaSchedule: max_vectorize_extent 64 (CPU); CUDA vectorizes 1-4 lanes
MAX_THREADS = 1024              # threads per block on every CUDA GPU
MAX_VTHREADS = 8                 # MetaSchedule's VerifyGPUCode allows 8 virtual threads
MAX_PREDICATED_SPLIT = 1 << 16   # the known factors of a split whose other factor is inferred
MAX_INT = 2 ** 31 - 1

_BOOL = {0, 1}
SCOPES = {"global", "shared", "shared.dyn", "local"}
THREAD_TAGS = {f"{kind}.{axis}" for kind in ("blockIdx", "threadIdx", "vthread") for axis in "xyz"}


def _int_in(lo: int, hi: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _int_list(lo: int, hi: int, length: int):
    return lambda v: isinstance(v, list) and len(v) <= length and all(_int_in(lo, hi)(x) for x in v)


def _tiling_structure(v) -> bool:        # '"SSRSRS"': a JSON string inside the trace's JSON
    return isinstance(v, str) and re.fullmatch(r'"[SR]{1,16}"', v) is not None


# Annotation key -> whether a value is in bounds (a literal in the trace, or a sampled value when replayed).
# These are the keys MetaSchedule's rules and postprocessors write for LLVM and CUDA (sm_90: its tensor-core
# rule's software pipelining included); `pragma_import_llvm`, `pragma_import_c` and every other key are not.
ANNOTATIONS = {
    "meta_schedule.tiling_structure": _tiling_structure,
    "meta_schedule.parallel": _int_in(1, MAX_INT),
    "meta_schedule.vectorize": _int_in(1, MAX_VECTOR_LANES),
    "meta_schedule.unroll_explicit": _int_in(0, MAX_UNROLL),
    "meta_schedule.unroll_implicit": _int_in(0, MAX_UNROLL),
    "meta_schedule.random_compute_producer": _int_in(0, 1),
    "meta_schedule.cooperative_fetch": _int_in(1, 16),
    "meta_schedule.thread_extent_low_inclusive": _int_in(1, MAX_THREADS),
    "meta_schedule.thread_extent_high_inclusive": _int_in(1, MAX_THREADS),
    "pragma_auto_unroll_max_step": _int_in(0, MAX_UNROLL),
    "pragma_unroll_explicit": _int_in(0, 1),
    "software_pipeline_stage": _int_list(0, 16, 16),
    "software_pipeline_order": _int_list(0, 16, 16),
    "software_pipeline_async_stages": _int_list(0, 16, 16),
}


def _name(v) -> bool:
    return isinstance(v, str) and 0 < len(v) <= MAX_NAME


# Instruction kind -> whether its attrs are the ones MetaSchedule's search space writes (LLVM: auto-inline,
# rfactor, multi-level tiling, parallel / vectorize / unroll, random compute location; CUDA: the same with
# thread binding, shared / local caches, cross-thread reduction, cooperative fetch). Not here, so refused:
# UnsafeSetDType, UnsafeHideBufferAccess, Unroll, Tensorize / Blockize / TransformLayout (tensor-core and
# layout-rewrite rules, which fp32 kernels do not get), StorageAlign and every other primitive.
ALLOWED_KINDS = {
    "GetSBlock": lambda a: len(a) == 2 and _name(a[0]) and a[1] == "main",
    "GetLoops": lambda a: a == [],
    "GetChildBlocks": lambda a: a == [],
    "GetProducers": lambda a: a == [],
    "GetConsumers": lambda a: a == [],
    "ComputeInline": lambda a: a == [],
    "ReverseComputeInline": lambda a: a == [],
    "ComputeAt": lambda a: len(a) == 2 and a[0] in _BOOL and _int_in(-2, 64)(a[1]),
    "ReverseComputeAt": lambda a: len(a) == 2 and a[0] in _BOOL and _int_in(-2, 64)(a[1]),
    "SampleComputeLocation": lambda a: a == [],
    "SamplePerfectTile": lambda a: len(a) == 2 and _int_in(1, 8)(a[0]) and _int_in(1, MAX_VECTOR_LANES)(a[1]),
    # its candidates: unroll steps, thread extents, vector lanes (all <= 1024)
    "SampleCategorical": lambda a: (len(a) == 2 and _int_list(0, MAX_UNROLL, 64)(a[0]) and isinstance(a[1], list)
                                    and len(a[1]) == len(a[0]) and a[0]
                                    and all(isinstance(p, (int, float)) for p in a[1])),
    "Split": lambda a: len(a) == 2 and a[0] in _BOOL and a[1] == 0,     # [preserve_unit_iters, disable_predication]
    "Fuse": lambda a: len(a) == 1 and a[0] in _BOOL,
    "Reorder": lambda a: a == [],
    "RFactor": lambda a: len(a) == 1 and _int_in(0, 64)(a[0]),
    "CacheRead": lambda a: len(a) == 2 and _int_in(0, 1024)(a[0]) and a[1] in SCOPES,
    "CacheWrite": lambda a: len(a) == 2 and _int_in(0, 1024)(a[0]) and a[1] in SCOPES,
    "SetScope": lambda a: len(a) == 2 and _int_in(0, 1024)(a[0]) and a[1] in SCOPES,
    "DecomposeReduction": lambda a: a == [],
    "Parallel": lambda a: a == [],
    "Vectorize": lambda a: a == [],
    "Bind": lambda a: len(a) == 1 and a[0] in THREAD_TAGS,
    "Annotate": lambda a: len(a) == 1 and a[0] in ANNOTATIONS,
    "Unannotate": lambda a: len(a) == 1 and a[0] in ANNOTATIONS,
    "EnterPostproc": lambda a: a == [],
}

_RV = re.compile(r"[blv][0-9]{1,7}")        # block, loop and expression random variables


def _input_ok(v) -> bool:
    """A trace input: a random variable, "None", a number, or a flat list of those (CacheWrite's consumers,
    a software-pipeline annotation's stages)."""
    if isinstance(v, list):
        return len(v) <= 64 and all(not isinstance(x, list) and _input_ok(x) for x in v)
    if isinstance(v, str):
        return v == "None" or _RV.fullmatch(v) is not None or _tiling_structure(v)
    return isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) <= MAX_INT


def trace_problem(trace) -> str | None:
    """Why a record's trace (its JSON form: ``[instructions, decisions]``) may not be applied, or None.
    Checked before TVM parses or replays anything of it."""
    if not (isinstance(trace, list) and len(trace) == 2 and isinstance(trace[0], list)
            and isinstance(trace[1], list)):
        return "the trace is not [instructions, decisions]"
    insts, decisions = trace
    if len(insts) > MAX_TRACE_INSTRUCTIONS:
        return f"the trace has {len(insts)} instructions (at most {MAX_TRACE_INSTRUCTIONS} are read)"
    for i, inst in enumerate(insts):
        if not (isinstance(inst, list) and len(inst) == 4 and isinstance(inst[0], str)
                and all(isinstance(p, list) for p in inst[1:])):
            return f"instruction {i} is not [kind, inputs, attrs, outputs]"
        kind, inputs, attrs, outputs = inst
        if kind not in ALLOWED_KINDS:
            return (f"instruction {i} is {kind[:MAX_NAME]!r}, not a schedule primitive MetaSchedule's search space "
                    "produces for dyntvm's kernels")
        if kind in ("Annotate", "Unannotate") and not (attrs and attrs[0] in ANNOTATIONS):
            key = attrs[0] if attrs and isinstance(attrs[0], str) else attrs
            return f"instruction {i} ({kind}) uses the annotation {str(key)[:MAX_NAME]!r}, which is not allowed"
        if not ALLOWED_KINDS[kind](attrs):
            return f"instruction {i} ({kind}) has attributes {json.dumps(attrs)[:200]} outside the allowed ones"
        if not (len(inputs) <= 64 and all(_input_ok(v) for v in inputs)
                and all(isinstance(v, str) and _RV.fullmatch(v) for v in outputs) and len(outputs) <= 64):
            return f"instruction {i} ({kind}) has malformed inputs or outputs"
        if kind == "Annotate":
            value = inputs[1] if len(inputs) == 2 else None
            literal = not (isinstance(value, str) and _RV.fullmatch(value))   # else: checked when replayed
            if literal and not ANNOTATIONS[attrs[0]](value):
                return f"instruction {i} annotates {attrs[0]} = {json.dumps(value)[:100]}, out of bounds"
    for d in decisions:
        if not (isinstance(d, list) and len(d) == 2 and _int_in(0, len(insts) - 1)(d[0])
                and (_int_in(-2, MAX_INT)(d[1]) or _int_list(1, MAX_INT, 16)(d[1]))):    # -2, -1: inline, root
            return f"a decision {json.dumps(d)[:100]} is malformed"
    return None


# ------------------------------------------------------------------------------------------ reading
def _json_lines(data: bytes, name: str, limit: int, what: str) -> list:
    """The JSON values of the lines of a database file's checked bytes (`log_files.read_database_files`)."""
    out = []
    for line in data.splitlines():
        if not line.strip():
            continue
        if len(out) == limit:
            raise ValueError(f"{name} has more than {limit} {what}")
        out.append(json.loads(line))          # parsed (depth-checked) once already: cannot fail
    return out


def _mean_run_secs(run_secs) -> float | None:
    """The mean measured time of a record as MetaSchedule ranks records; None: not a usable measurement."""
    if not (isinstance(run_secs, list) and run_secs
            and all(isinstance(s, (int, float)) and not isinstance(s, bool) and 0 < s <= 1e10 for s in run_secs)):
        return None         # a time that is not one (negative: ranked first; beyond float32: TVM refuses the log)
    if all(s == 1e10 for s in run_secs):                # MetaSchedule's stub for a failed measurement
        return None
    mean = sum(run_secs) / len(run_secs)
    return mean if math.isfinite(mean) else None


def load_checked_database(path: str, files: dict | None = None):
    """``(JSONDatabase, rejected)`` of the log folder `path` (its database files' bytes `files`, read by
    `log_files.read_database_files` when not given): the database holds, per workload, its best record if that
    passed `trace_problem`; `rejected` maps the structural hash (as the workload file writes it) of each
    workload whose best record did not to the reason. ValueError (LogFileError too): the files are unusable."""
    from .log_files import load_database, read_database_files
    files = read_database_files(path) if files is None else files
    workloads = _json_lines(files[WORKLOADS], WORKLOADS, MAX_WORKLOADS, "workloads")
    if not all(isinstance(w, list) and len(w) == 2 and all(isinstance(x, str) for x in w) for w in workloads):
        raise ValueError(f"{WORKLOADS} holds entries other than [structural hash, module]")
    best: dict = {}
    for rec in _json_lines(files[RECORDS], RECORDS, MAX_RECORDS, "records"):
        if not (isinstance(rec, list) and len(rec) == 2 and _int_in(0, len(workloads) - 1)(rec[0])
                and isinstance(rec[1], list) and len(rec[1]) == 4):
            raise ValueError(f"{RECORDS} holds an entry other than [workload index, [trace, times, target, args]]")
        mean = _mean_run_secs(rec[1][1])
        if mean is not None and (rec[0] not in best or mean < best[rec[0]][0]):
            best[rec[0]] = (mean, rec)
    rejected, kept = {}, []
    for index, (_, rec) in best.items():
        why = trace_problem(rec[1][0])
        if why is None:                 # the record's target and argument info are not needed: not passed on
            kept.append((index, [rec[1][0], rec[1][1], None, None]))
        else:
            rejected.setdefault(workloads[index][0], why)
    numbers = {index: n for n, (index, _) in enumerate(kept)}
    db = load_database({WORKLOADS: "".join(json.dumps(workloads[index]) + "\n" for index, _ in kept).encode(),
                        RECORDS: "".join(json.dumps([numbers[index], body]) + "\n" for index, body in kept).encode()})
    return db, rejected


# ------------------------------------------------------------------------------------------ replaying
class RecordRefused(Exception):
    """A record's trace did something outside the bounds while it was replayed."""


def _int_value(sch, v):
    """The integer of a replayed input (None stays None): a literal, or a sampled expression random variable."""
    from tvm import tirx
    if isinstance(v, tirx.Var):
        v = sch.get(v)
    if v is None or (isinstance(v, int) and not isinstance(v, bool)):
        return v
    if isinstance(v, tirx.IntImm):
        return int(v.value)
    raise RecordRefused(f"an operand {str(v)[:100]} that is not an integer")


def _extent(sch, loop) -> int:
    from tvm import tirx
    ext = sch.get(loop).extent
    if not isinstance(ext, tirx.IntImm):
        raise RecordRefused(f"a loop of symbolic extent {ext}")
    return int(ext.value)


def _check_replayed(sch, inst, inputs, attrs) -> None:
    """Bounds only a replay can see (the loop extents and sampled values of this kernel)."""
    from tvm import tirx
    kind = inst.kind.name
    if kind not in ALLOWED_KINDS:                   # checked statically too: the database held only allowed ones
        raise RecordRefused(f"the instruction {kind}")
    if kind == "Split":
        extent = _extent(sch, inputs[0])
        factors = [_int_value(sch, f) for f in inputs[1:]]
        known = [f for f in factors if f is not None]
        if any(f < 1 for f in known) or len(factors) - len(known) > 1:
            raise RecordRefused(f"a split of a loop of {extent} into {factors}")
        # sampled tiles multiply to the extent; a split with an inferred (None) factor may overshoot it, the
        # extra iterations masked by its predicate (MetaSchedule splits by 64 lanes or 1024 threads whatever
        # the extent): bounded here
        product = math.prod(known)
        if (len(known) == len(factors) and product != extent) or product > max(extent, MAX_PREDICATED_SPLIT):
            raise RecordRefused(f"a split of a loop of {extent} into {factors} (the factors must multiply to "
                                f"the extent, or with one None factor to at most {MAX_PREDICATED_SPLIT})")
    elif kind == "Vectorize" and _extent(sch, inputs[0]) > MAX_VECTOR_LANES:
        raise RecordRefused(f"a vectorized loop of {_extent(sch, inputs[0])} (at most {MAX_VECTOR_LANES})")
    elif kind == "Bind":
        tag, extent = str(attrs[0]), _extent(sch, inputs[0])
        limit = MAX_THREADS if tag.startswith("threadIdx") else MAX_VTHREADS if tag.startswith("vthread") else MAX_INT
        if extent > limit:
            raise RecordRefused(f"{tag} bound to a loop of {extent} (at most {limit})")
    elif kind == "Annotate" and isinstance(inputs[1], (tirx.Var, tirx.IntImm)):    # strings: checked statically
        key, value = str(attrs[0]), _int_value(sch, inputs[1])
        if not ANNOTATIONS.get(key, lambda _: False)(value):
            raise RecordRefused(f"the annotation {key} = {value}, out of bounds")


def replay_checked(task, trace):
    """`trace` replayed on a fresh schedule of `task` (our own kernel, as an IRModule), each instruction checked
    by `_check_replayed` before it is applied; the scheduled PrimFunc. RecordRefused: a bound was broken."""
    from tvm import s_tir
    sch = s_tir.Schedule(task)
    broken = []

    def check(inst, inputs, attrs, decision):
        try:
            _check_replayed(sch, inst, list(inputs), list(attrs))
        except RecordRefused as e:
            broken.append(str(e))
            raise
        return decision
    try:
        trace.apply_to_schedule(sch, remove_postproc=False, decision_provider=check)
    except Exception as e:  # noqa: BLE001 - TVM re-raises the callback's error as its own type
        raise RecordRefused(broken[0] if broken else f"it does not replay ({type(e).__name__}: "
                            f"{str(e).strip().splitlines()[-1][:200] if str(e).strip() else ''})") from None
    new = sch.mod["main"]
    if _signature(new) != _signature(task["main"]):
        raise RecordRefused("it changes the kernel's parameters")
    return new


def _signature(func) -> list:
    return [(str(p.dtype), [str(d) for d in getattr(p, "shape", ())]) for p in func.params]


def trusted_schedule(log, key: str, func, target):
    """The log's tuned schedule of `func` (workload `key`), or None: no record (``log.unscheduled``), or a record
    refused by the checks above or by `verify_tuned` (``log.refused[key]``: why)."""
    import tvm_ffi

    from .tuning_task import _main_mod, task_func
    task = _main_mod(task_func(func))
    why = log.rejected.get(str(tvm_ffi.structural_hash(task) & (2 ** 64 - 1)))
    if why is None:
        record = log.database.query_tuning_record(task, target=target, workload_name="main")
        if record is None:
            log.unscheduled.add(key)
            return None
        try:
            tuned = replay_checked(task, record.trace)
            why = verify_tuned(func, tuned, target, log.winners()[key].get("name", ""))
        except RecordRefused as e:
            why = str(e)
    if why is not None:
        log.refused[key] = why
        return None
    return tuned.with_attr("tirx.is_scheduled", True)


# ------------------------------------------------------------------------------------------ verifying
def _tolerance(dtype: str) -> float | None:
    """Relative tolerance of a tuned kernel's outputs (another loop order rounds differently); None: exact."""
    kind = np.dtype(dtype).kind if dtype != "bfloat16" else "f"
    if kind != "f":
        return None
    return 2e-2 if dtype in ("float16", "bfloat16") else 1e-3


def _differs(tuned: np.ndarray, default: np.ndarray, dtype: str) -> str | None:
    rtol = _tolerance(dtype)
    if rtol is None:
        bad = tuned != default
    else:
        t, d = tuned.astype(np.float64), default.astype(np.float64)
        finite = np.abs(d[np.isfinite(d)])
        scale = max(1.0, float(finite.max())) if finite.size else 1.0
        bad = ~np.isclose(t, d, rtol=rtol, atol=rtol / 10 * scale, equal_nan=True)
    if not bad.any():
        return None
    i = np.unravel_index(int(np.argmax(bad)), bad.shape) if bad.ndim else ()
    return f"{int(bad.sum())} of {bad.size} elements differ (at {list(i)}: {tuned[i]} instead of {default[i]})"


def verify_tuned(func, tuned, target, name: str = "") -> str | None:
    """Why the tuned kernel is refused after running it and the default kernel (our CPU schedule; dlight's
    on CUDA) of `func` on the same random inputs (both built in one library of their own); None when every
    parameter buffer (the outputs, written over the same random contents) matches. A CUDA kernel is not run without a GPU (None)."""
    import tvm

    from .backends import backend_of
    from .tuning_task import _random_args
    backend = backend_of(target)
    if not backend.runnable_here():
        return None
    dev = backend.tuning_device()
    try:
        default = backend.default_schedule(func, target, name)
    except Exception as e:  # noqa: BLE001 - no default kernel to compare with: the tuned one is not used unchecked
        return f"the default kernel to compare it with failed ({type(e).__name__}: {str(e).strip()[-200:]})"
    seed = int.from_bytes(os.urandom(4), "little")        # not known to whoever wrote the log
    kernels = {"tuned": tuned, "default": default}
    try:                                                 # one build of both: half the time of two
        with target:
            lib = tvm.compile(tvm.IRModule({n: f.with_attr("global_symbol", n) for n, f in kernels.items()}),
                              target=target)
    except Exception as e:  # noqa: BLE001 - they do not build alone: nothing to compare with
        return f"it does not build alone ({type(e).__name__}: {str(e).strip()[-200:]})"
    results = []
    for which in kernels:
        try:
            args = _random_args(func, dev, seed)
            lib[which](*args)
            results.append([a.numpy() for a in args])
        except Exception as e:  # noqa: BLE001 - e.g. a CUDA launch refused: the kernel is not usable
            return f"the {which} kernel did not run ({type(e).__name__}: {str(e).strip()[-200:]})"
    for p, t, d in zip(func.params, *results):
        why = _differs(t, d, str(p.dtype))
        if why is not None:
            return f"its results differ from the default kernel's on random inputs (seed {seed}): {why}"
    return None


def warn_refused(log) -> None:
    """One TuningWarning naming each kernel whose tuned record was refused, and why."""
    if log.refused:
        names = log.winners()
        lines = "; ".join(f"{str(names.get(k, {}).get('name', k))[:100]!r}: {why}"
                          for k, why in sorted(log.refused.items()))
        n = len(log.refused)
        warnings.warn(f"dyntvm: tuning log {log.path}: {n} tuned kernel{'s' if n > 1 else ''} refused, built with "
                      f"the default schedule{'s' if n > 1 else ''} instead (a log may only choose among schedules "
                      f"MetaSchedule produces, and they must compute what the default kernels do): {lines}",
                      _tuning_warning(), stacklevel=4)


def _tuning_warning():
    from .tuning_task import TuningWarning
    return TuningWarning


def check_database_to_resume(path: str) -> None:
    """A tune resuming in `path` seeds MetaSchedule's search with the database's records, whose candidates it
    builds and runs: every record there must pass `trace_problem` (CompileError naming the first that does
    not). A folder without a database passes."""
    from ..errors import CompileError
    from .log_files import MAX_DATABASE_BYTES, check_json_lines, read_regular_file
    if not os.path.lexists(os.path.join(path, RECORDS)):
        return
    try:
        data = read_regular_file(os.path.join(path, RECORDS), MAX_DATABASE_BYTES)
        check_json_lines(data, os.path.join(path, RECORDS))
        records = _json_lines(data, RECORDS, MAX_RECORDS, "records")
    except ValueError as e:                         # LogFileError too
        raise CompileError(f"tune: {path}'s MetaSchedule database is not readable ({type(e).__name__}: {e}); remove "
                           "it or pick another log_dir") from None
    for n, rec in enumerate(records, 1):
        trace = rec[1][0] if isinstance(rec, list) and len(rec) == 2 and isinstance(rec[1], list) and rec[1] else None
        why = trace_problem(trace)
        if why is not None:
            raise CompileError(f"tune: record {n} of {os.path.join(path, RECORDS)} is refused: {why}; a tune would "
                               "build and run it. Remove the database or pick another log_dir")
