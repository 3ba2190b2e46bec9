"""Weights of the merged contraction kernels (`cpu_schedule_fuse`) packed once, at compile time (issue 24).

The packed matmul schedule (`cpu_schedule_matmul._pack_panel`) copied the right operand's K x nr column panels
into a workspace at every call: for an LSTM step at batch 16 (U: 256 x 1024 floats) ~25% of the step kernel,
and at batch 1 the GEMV read U's rows (4 KiB apart: one page per k) straight from L3. When that operand is a
constant of the model (an LSTM's recurrent weight), this pass (after FuseTIR, before scheduling) rewrites it
into the panel layout ``[N / nr, K, nr]`` (``P[j // nr, k, j % nr] = U[k, j]``): the PrimFunc's parameter is
transformed (``transform_layout``) and the Relax constant at every call site replaced by its packed copy. The
kernel carries `PREPACKED` (its parameter index -> nr); both schedules of the group read the panels as they
are: the many-row variant without a copy, the GEMV (few rows) with a column tile of one panel per gate (each
gate a contiguous stream over k).
"""

from __future__ import annotations

import logging

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.s_tir import SBlockRealize

from .cpu_sched_helpers import PREPACKED, pick_tile, vector_lanes
from .cpu_schedule_fuse import CONTRACTION_GROUP
from .cpu_schedule_matmul import _MATMUL_MR, tile_columns

_LOG = logging.getLogger(__name__)

#: False: no packing at compile time (the per-call panel copy, as before; for A/B measurements).
PREPACK_WEIGHTS = True


def panel_columns(n: int, target, dtype: str) -> int | None:
    """Columns of a packed panel of an N-column right operand: the column tile of the many-row matmul
    schedule (`cpu_schedule_matmul._sched_matmul` with `_MATMUL_MR` rows), which reads the panels."""
    return pick_tile(n, tile_columns(_MATMUL_MR, target, dtype), vector_lanes(target, dtype), at_most=True)


def _right_operand_params(func: tirx.PrimFunc) -> dict:
    """{param index: (K, N)} of `func`'s 2-d static parameters that are read only as the right operand
    ``W[k, j]`` of one contraction block (k the block's reduction iter, j its last spatial iter) and never
    written."""
    params = {p.__chandle__(): n for n, p in enumerate(func.params)}
    good, bad = {}, set()

    def visit(node):
        block = node.block
        kinds = [iv.iter_type for iv in block.iter_vars]
        for w in block.writes:
            bad.add(params.get(w.source.__chandle__()))
        for r in block.reads:
            n = params.get(r.source.__chandle__())
            if n is None:
                continue
            reduce = [iv.var for iv, kind in zip(block.iter_vars, kinds) if kind == tirx.IterVar.CommReduce]
            spatial = [iv.var for iv, kind in zip(block.iter_vars, kinds) if kind == tirx.IterVar.DataPar]
            reg = r.region
            if (len(reg) == 2 and len(reduce) == 1 and spatial and reg[0].min.same_as(reduce[0])
                    and reg[1].min.same_as(spatial[-1]) and all(isinstance(x.extent, tirx.IntImm)
                                                                and int(x.extent) == 1 for x in reg)):
                if n in good:       # one reading block (the matmul the schedule pads, then inlines it into)
                    bad.add(n)
                good[n] = block.name_hint
            else:
                bad.add(n)
    tvm_ffi.structural_walk(func.body, (SBlockRealize, visit))
    out = {}
    for n, name in good.items():
        shape = func.params[n].shape
        if n not in bad and all(isinstance(d, tirx.IntImm) for d in shape):
            out[n] = (name, int(shape[0]), int(shape[1]))
    return out


def _panel_map(nr: int):
    return lambda k, j: (j // nr, k, j % nr)


def _pack_func(func: tirx.PrimFunc, params: dict) -> tirx.PrimFunc:
    """`func` with each parameter of `params` ({index: (reading block, nr)}) in the panel layout."""
    sch = s_tir.Schedule(func)
    for n, (block_name, nr) in params.items():
        block = sch.get_sblock(block_name)
        idx = next(i for i, r in enumerate(sch.get(block).reads) if r.source.same_as(func.params[n]))
        unpack = sch.cache_read(block, idx, "global")  # W[k, j] = P[j // nr, k, j % nr], inlined when scheduled
        sch.transform_layout(unpack, ("read", 0), _panel_map(nr))
    out = sch.mod["main"]
    i64 = lambda v: tirx.IntImm("int64", v)  # noqa: E731
    return out.with_attr(PREPACKED, {i64(n): i64(nr) for n, (_, nr) in params.items()})


def packed_value(value: np.ndarray, nr: int) -> np.ndarray:
    """[K, N] -> its panels [N / nr, K, nr]."""
    k, n = value.shape
    return np.ascontiguousarray(value.reshape(k, n // nr, nr).transpose(1, 0, 2))


def _call_sites(mod) -> dict:
    """{PrimFunc name: [call_tir Call]} of the contraction-group kernels, over every Relax function."""
    sites: dict = {}

    def visit(expr):
        if (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.call_tir"
                and expr.args[0].name_hint.startswith(CONTRACTION_GROUP)):
            sites.setdefault(expr.args[0].name_hint, []).append(expr)
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return sites


@relax.expr_functor.mutator
class _SwapConstants(relax.PyExprMutator):
    """Replaces the constant arguments of call_tir calls of the packed kernels ({name: {index: nr}}), and their
    GlobalVars (`gvars`: {name: the packed kernel's})."""

    def __init__(self, mod, packed: dict, gvars: dict):
        super().__init__(mod)
        self.packed, self.gvars = packed, gvars
        self.cache: dict = {}

    def visit_call_(self, call):  # pylint: disable=arguments-renamed
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.call_tir"
                and call.args[0].name_hint in self.packed):
            return call
        params = self.packed[call.args[0].name_hint]
        args = list(call.args[1].fields)
        for n, nr in params.items():
            key = (args[n].__chandle__(), nr)
            if key not in self.cache:
                self.cache[key] = relax.const(packed_value(args[n].value.numpy(), nr), args[n].value.dtype)
            args[n] = self.cache[key]
        return relax.Call(call.op, [self.gvars[call.args[0].name_hint], relax.Tuple(args), *call.args[2:]],
                          call.attrs, call.ty_args)


def prepack_weights(target) -> tvm.transform.Pass:
    """Module pass (after FuseTIR): the constant right operands of the contraction-group kernels in the panel
    layout (module doc). A kernel called with a non-constant at that position keeps its layout."""
    def run(mod, _ctx):
        if not PREPACK_WEIGHTS:
            return mod
        sites = _call_sites(mod)
        packed, funcs = {}, {}
        for name, calls in sites.items():
            func = mod[name]
            if not isinstance(func, tirx.PrimFunc):
                continue
            params = {}
            for n, (block, k, n_cols) in _right_operand_params(func).items():
                if not all(isinstance(c.args[1].fields[n], tvm.ir.expr.Constant) for c in calls):
                    continue
                nr = panel_columns(n_cols, target, func.params[n].dtype)
                if nr is None or n_cols % nr or nr == n_cols or k < 1:
                    continue
                params[n] = (block, nr)
            if not params:
                continue
            try:
                funcs[name] = _pack_func(func, params)
            except Exception as err:  # pylint: disable=broad-except
                _LOG.debug("prepack_weights: %s keeps its layout: %s", name, err)
                continue
            packed[name] = {n: nr for n, (_, nr) in params.items()}
        if not packed:
            return mod
        # the packed kernels under new GlobalVars: a GlobalVar carries its function's type (the old parameter
        # shapes: CallTIRRewrite checked the packed constant against them)
        out = tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv.name_hint not in funcs},
                           attrs=mod.attrs, global_infos=mod.global_infos)
        bb = relax.BlockBuilder(out)
        gvars = {name: bb.add_func(f, name) for name, f in funcs.items()}
        out = bb.get()
        swap = _SwapConstants(out, packed, gvars)
        for gv, func in list(out.functions_items()):
            if isinstance(func, relax.Function):
                out[gv] = swap.visit_expr(func)
        return out
    return tvm.transform.module_pass(run, opt_level=0, name="DyntvmPrepackWeights")
