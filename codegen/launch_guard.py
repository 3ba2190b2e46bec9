"""No GPU kernel launch over an empty grid.

A CUDA kernel's grid comes from its thread-bound loops (``blockIdx.x`` over ``ceil(N * 4 / 1024)``, say).
With a symbolic dim of 0 the grid is empty and launching it fails with a CUDA error that poisons the
whole context (seen on an H100: ``sum(x, axis=1)`` over ``x: [0, 4]`` ended the process with
``cudaErrorIllegalAddress``). Each scheduled PrimFunc whose thread extents are symbolic gets its body
wrapped in ``if extent_1 > 0 and ...:``, which stays on the host side of the host/device split: the
launch is skipped and the (empty) outputs are left as allocated.

The guard must go in late: TVM's ThreadSync pass refuses kernels whose body sits under a condition
("Cannot insert syncs inside condition"), so it is added right before SplitHostDevice, when kernels are
``thread_extent`` attributes (`with_launch_guards` puts it there for the duration of a build).
"""
from __future__ import annotations

import contextlib
import threading

import tvm
from tvm import tirx
from tvm.tirx.buffer import is_buffer_var

_CHILDREN = ("body", "block", "then_case", "else_case")


def thread_extents(stmt, out: list) -> list:
    """Extents of the thread-bound loops (`ForKind.THREAD_BINDING`) under `stmt`."""
    if stmt is None:
        return out
    if isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            thread_extents(s, out)
        return out
    if isinstance(stmt, tirx.For) and stmt.kind == tirx.ForKind.THREAD_BINDING:
        out.append(stmt.extent)
    elif isinstance(stmt, tirx.AttrStmt) and stmt.attr_key == "thread_extent":
        out.append(stmt.value)
    for name in _CHILDREN:
        try:
            child = getattr(stmt, name)
        except AttributeError:
            continue
        if isinstance(child, tirx.Stmt):
            thread_extents(child, out)
    return out


def launch_condition(f: tirx.PrimFunc):
    """`extent > 0` for each symbolic thread extent of `f` readable from its parameters, or None."""
    known = set()
    for p in f.params:
        if is_buffer_var(p):
            for d in p.ty.shape:
                known.update(v.name for v in tirx.analysis.undefined_vars(d))
        else:
            known.add(p.name)
    conds, seen = [], set()
    for e in thread_extents(f.body, []):
        if isinstance(e, tirx.IntImm) or str(e) in seen:
            continue
        if all(v.name in known for v in tirx.analysis.undefined_vars(e)):
            seen.add(str(e))
            conds.append(e > 0)
    if not conds:
        return None
    cond = conds[0]
    for c in conds[1:]:
        cond = tirx.And(cond, c)
    return cond


class _Stats:
    guarded = 0                      # kernels given a launch guard so far (tests read it)


stats = _Stats()


@tvm.transform.module_pass(opt_level=0, name="dyntvm.SkipEmptyLaunches")
def skip_empty_launches(mod: tvm.IRModule, ctx) -> tvm.IRModule:
    """Wrap each PrimFunc with symbolic thread extents in ``if extent > 0``."""
    for gv, f in list(mod.functions.items()):
        # a compiled loop function (compiled_loops) guards each of its copy kernels itself: a guard around the
        # whole function would skip the loop
        if isinstance(f, tirx.PrimFunc) and not f.attrs.get("dyntvm.compiled_loop", False):
            cond = launch_condition(f)
            if cond is not None:
                mod[gv] = f.with_body(tirx.IfThenElse(cond, f.body, None))
                stats.guarded += 1
    return mod


_LOCK = threading.Lock()


@contextlib.contextmanager
def with_launch_guards():
    """During a CUDA build: TVM's TIR pipeline (0.27's `s_tir` pipeline, which looks the pass up when it runs)
    gets `skip_empty_launches` right before `SplitHostDevice`. On CPU kernels (no thread extents) it is a
    no-op, so a CPU build in another thread meanwhile is unaffected."""
    from tvm.tirx import transform as tt
    with _LOCK:
        split = tt.SplitHostDevice
        tt.SplitHostDevice = lambda: tvm.transform.Sequential([skip_empty_launches, split()])
        try:
            yield
        finally:
            tt.SplitHostDevice = split
