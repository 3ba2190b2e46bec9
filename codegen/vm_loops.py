"""The VM program's loops (`vm_program`): a foreach / while_loop as a call of its compiled loop where codegen built
one, else a recursive function of the program over a range of steps (see `vm_program`'s module doc). `LoopLowering`
is a part of `vm_program._Lowering`: its methods use the lowering's `graph`, `_items`, `_if`, `_match`, `_view`,
`_recursive` and the functions it collects."""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from dyntvm.errors import CompileError

from ..ir.compiled_loop import compiled_loop_name, foreach_loop_plan, while_loop_plan
from ..ir.types import TensorType
from .vm_seq import FALLBACK_CALLBACK, _dtype_imm, _i64, _ret_ty, _Seq, _ty, _TRUE

_CHAIN = 32                     # a foreach's steps (`_inplace_foreach`) run by a recursion one level per step
_WHILE_BYTES = 16 << 20         # a while_loop's call of its compiled loop stacks at most this many bytes (>= a row)
_WHILE_UNSTACKED = 1 << 24      # iterations per call of a loop that stacks nothing
_WHILE_HALVING_MAX = 1 << 16    # iterations per `steps` call of a while_loop without a compiled loop (16 deep)


def _inplace_ok(n) -> bool:
    """Whether a foreach's per-step outputs (at least one) all have static shapes (`_inplace_foreach`)."""
    body = n.subgraphs[0]
    ys = body.outputs[:len(body.outputs) - n.attrs.num_states]
    return bool(ys) and all(isinstance(d, int) for v in ys for d in v.type.shape)


def _rows_per_call(row_types: list) -> int:
    """The most iterations one call of a compiled while_loop runs: as the executor (`runtime/loop_calls.py`)."""
    if not row_types:
        return _WHILE_UNSTACKED
    if not all(isinstance(d, int) for t in row_types for d in t.shape):
        return 4096                 # rows whose size is known only when the loop runs
    row = sum(int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize for t in row_types)
    return max(1, _WHILE_BYTES // row) if row else _WHILE_UNSTACKED


class LoopLowering:
    """The foreach / while_loop lowering of `vm_program._Lowering`."""

    def _foreach(self, seq, n, ins):
        plan = foreach_loop_plan(n)
        loop = self.funcs.get(compiled_loop_name(plan[0].attrs.name)) if plan is not None else None
        if loop is not None:
            region, roles, _ = plan
            nd, ns = n.attrs.num_data, n.attrs.num_states
            args = [ins[k if r == "data" else nd + k if r == "state" else nd + ns + k] for r, k in roles]
            res = seq.emit(relax.Call(loop, args), "loop")
            return self._items(seq, res, len(n.outputs))
        if _inplace_ok(n):
            return self._inplace_foreach(seq, n, ins)
        return self._halving_foreach(seq, n, ins)

    def _inplace_foreach(self, seq, n, ins):
        """A foreach without a compiled loop whose per-step outputs have static shapes: its stacks are allocated
        once per call and each step copies its rows into them (``runtime.TVMTensorCopyFromTo`` into a view of
        the row), so the recursion ``steps(data..., states..., caps..., stacks..., (lo, hi))`` returns only the
        states (no concatenation per level). A range of more than `_CHAIN` steps runs its two halves, a shorter
        one its first step and then itself on the rest (a call per step, at most `_CHAIN` deep: the VM's stack
        limits recursion). A step reads row `lo` of each data input
        as a view's ``vm.builtin.ensure_zero_offset`` (a copy: kernels take no byte offset, and the VM's ``If``
        reads a tensor's data pointer without its byte offset)."""
        body, in_types = n.subgraphs[0], [v.type for v in n.inputs]
        nd, ns, n_ys, row_types, out_types, lo, hi, params = _foreach_signature(n)
        stacks = [relax.Var(f"stack{k}", _ty(t)) for k, t in enumerate(out_types[:n_ys])]
        rng = relax.Var("range", relax.ShapeType([lo, hi]))
        # returns the states and the first stack (the VM calls no function returning the empty tuple)
        ret = [_ty(t) for t in out_types[n_ys:]] + [_ty(out_types[0])]
        name, gv = self._recursive("foreach", params + stacks + [rng], ret)
        data, states, caps = params[:nd], params[nd:nd + ns], params[nd + ns:]

        one = _Seq(self.bb)                         # a short range: the body on row `lo`, then the rest
        rows = [self._row(one, d, t, lo) for d, t in zip(data, in_types[:nd])]
        outs = self.graph(one, body, rows + states + caps)
        for y, st, t in zip(outs[:n_ys], stacks, row_types):
            self._write_row(one, st, y, t, lo)
        rest = _Seq(self.bb)
        got = rest.emit(relax.Call(gv, data + outs[n_ys:] + caps + stacks + [relax.ShapeExpr([lo + _i64(1), hi])]),
                        "rest")
        vals = self._if(one, tvm.tirx.EQ(hi - lo, _i64(1)), _Seq(self.bb), outs[n_ys:] + [stacks[0]],
                        rest, self._items(rest, got, len(ret)), "rest")

        two = _Seq(self.bb)                         # two halves, in order
        mid = lo + tvm.tirx.floordiv(hi - lo, _i64(2))
        first = two.emit(relax.Call(gv, data + states + caps + stacks + [relax.ShapeExpr([lo, mid])]), "first")
        first_states = [two.emit(relax.TupleGetItem(first, k)) for k in range(ns)]
        second = two.emit(relax.Call(gv, data + first_states + caps + stacks + [relax.ShapeExpr([mid, hi])]),
                          "second")
        body_seq = _Seq(self.bb)
        res = self._if(body_seq, hi - lo <= _i64(_CHAIN), one, vals, two, self._items(two, second, len(ret)), "steps")
        func = relax.Function(params + stacks + [rng], body_seq.result(res),
                              relax.TupleType(ret), is_pure=False)
        self.recursive.append((gv, func.with_attr("global_symbol", name)))

        steps = self._steps_of_data(seq, ins, in_types, nd)
        run = _Seq(self.bb)
        bufs = [run.emit(relax.op.builtin.alloc_tensor(relax.ShapeExpr([steps] + [_i64(d) for d in t.shape]),
                                                       t.dtype, 0), "stack") for t in row_types]
        got = run.emit(relax.Call(gv, ins + bufs + [relax.ShapeExpr([_i64(0), steps])]), "steps")
        run_seq = run.result(bufs + self._items(run, got, ns))
        res = seq.emit(relax.If(tvm.tirx.EQ(steps, _i64(0)), self._zero_steps(n, row_types, ins, out_types, nd, ns),
                                run_seq), "foreach")
        return self._items(seq, res, len(out_types))

    def _steps_of_data(self, seq: _Seq, ins: list, in_types: list, nd: int):
        """The step count of a foreach: axis 0 of its `nd` data inputs (``ins[:nd]``, replaced by their
        ``match_cast`` to ``[steps, ...]``: all data the same length, checked)."""
        steps = tvm.tirx.Var("steps", "int64")
        for k, d in enumerate(ins[:nd]):
            t = in_types[k]
            shape = [steps] + [tvm.tirx.Var(f"d{k}_{j}", "int64") for j in range(1, t.ndim)]
            ins[k] = self._match(seq, d, relax.TensorType(shape, t.dtype))
        return steps

    def _row(self, seq: _Seq, d, t: TensorType, lo):
        """Row `lo` of `d` (a data input of type `t`), copied."""
        self.row_views = True       # (`ensure_zero_offset` needs a 64-byte aligned `d`: no ELEMENT_ALIGNED_FUNCTION)
        row_shape = [tvm.tirx.Var(f"r{j}", "int64") for j in range(1, t.ndim)]
        d = self._match(seq, d, relax.TensorType([tvm.tirx.Var("n", "int64")] + row_shape, t.dtype))
        size = _i64(np.dtype(t.dtype).itemsize)
        for r in row_shape:
            size = size * r
        view = seq.emit(relax.call_pure_packed(
            "runtime.TVMTensorCreateView", d, relax.ShapeExpr(row_shape), _dtype_imm(t.dtype),
            relax.expr.prim_value(lo * size), ty_args=relax.TensorType(row_shape, t.dtype)), "row")
        return seq.emit(relax.call_pure_packed("vm.builtin.ensure_zero_offset", view,
                                               ty_args=relax.TensorType(row_shape, t.dtype)), "row")

    def _write_row(self, seq: _Seq, stack, y, t: TensorType, lo):
        """Copy `y` (a step's output of static type `t`) into row `lo` of `stack`."""
        shape = [_i64(d) for d in t.shape]
        size = int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize
        dst = seq.emit(relax.call_pure_packed(
            "runtime.TVMTensorCreateView", stack, relax.ShapeExpr(shape), _dtype_imm(t.dtype),
            relax.expr.prim_value(lo * _i64(size)), ty_args=relax.TensorType(shape, t.dtype)), "dst")
        y = self._match(seq, y, relax.TensorType(shape, t.dtype))     # (the body's output type: checked)
        seq.emit(relax.Call(relax.ExternFunc("runtime.TVMTensorCopyFromTo"), [y, dst],
                            ty_args=[relax.TupleType([])]), "copy")

    def _halving_foreach(self, seq, n, ins):
        body, in_types = n.subgraphs[0], [v.type for v in n.inputs]
        nd, ns, n_ys, row_types, out_types, lo, hi, params = _foreach_signature(n)
        rng = relax.Var("range", relax.ShapeType([lo, hi]))
        name, gv = self._recursive("foreach", params + [rng], [_ty(t) for t in out_types])
        data, states, caps = params[:nd], params[nd:nd + ns], params[nd + ns:]

        one = _Seq(self.bb)                         # one step: the body on row `lo`
        rows = [one.emit(relax.op.squeeze(one.emit(relax.op.strided_slice(self._shaped(one, d), [0], [lo],
                                                                           [lo + _i64(1)])), [0]), "row")
                for d in data]
        outs = self.graph(one, body, rows + states + caps)
        stacked = [one.emit(relax.op.expand_dims(self._shaped(one, y), 0)) for y in outs[:n_ys]]
        one_seq = one.result(stacked + outs[n_ys:])

        two = _Seq(self.bb)                         # two halves, in order
        mid = lo + tvm.tirx.floordiv(hi - lo, _i64(2))
        first = two.emit(relax.Call(gv, data + states + caps + [relax.ShapeExpr([lo, mid])]), "first")
        first_states = [two.emit(relax.TupleGetItem(first, n_ys + k)) for k in range(ns)]
        second = two.emit(relax.Call(gv, data + first_states + caps + [relax.ShapeExpr([mid, hi])]), "second")
        ys = [self._concat(two, two.emit(relax.TupleGetItem(first, k)), two.emit(relax.TupleGetItem(second, k)))
              for k in range(n_ys)]
        two_seq = two.result(ys + [two.emit(relax.TupleGetItem(second, n_ys + k)) for k in range(ns)])

        body_seq = _Seq(self.bb)
        res = body_seq.emit(relax.If(tvm.tirx.EQ(hi - lo, _i64(1)), one_seq, two_seq), "steps")
        func = relax.Function(params + [rng], body_seq.result(self._items(body_seq, res, len(out_types))),
                              _ret_ty(out_types), is_pure=False)
        self.recursive.append((gv, func.with_attr("global_symbol", name)))     # added under `gv` at the end

        # the call: the steps are axis 0 of the data (all data the same length, checked by a match_cast)
        steps = self._steps_of_data(seq, ins, in_types, nd)
        run = _Seq(self.bb)
        got = run.emit(relax.Call(gv, ins + [relax.ShapeExpr([_i64(0), steps])]), "steps")
        run_seq = run.result(self._items(run, got, len(out_types)))
        res = seq.emit(relax.If(tvm.tirx.EQ(steps, _i64(0)), self._zero_steps(n, row_types, ins, out_types, nd, ns), run_seq),
                       "foreach")
        return self._items(seq, res, len(out_types))

    def _while_loop(self, seq, n, ins):
        """A while_loop with a compiled loop: its condition graph decides the first iteration; then calls of
        the loop function of 256 iterations, then twice as many each call (within `_WHILE_BYTES` of stacked
        rows), until the condition fails or max_iterations is reached: a recursion one level per call."""
        a = n.attrs
        plan = while_loop_plan(n)
        loop = self.funcs.get(compiled_loop_name(plan[0].attrs.name)) if plan is not None else None
        if loop is None:                           # no compiled loop: a growing carry, a body codegen declined
            return self._halving_while(seq, n, ins)
        roles = plan[1]
        cond_g, body = n.subgraphs
        nv, has_t = a.num_vars, a.has_max_tensor
        n_ys = len(n.outputs) - nv
        vars_, caps = ins[:nv], ins[nv + has_t:]
        row_types = [v.type for v in body.outputs[:n_ys]]
        out_types = [TensorType((0,) + tuple(t.shape), t.dtype) for t in row_types] + \
            [v.type for v in body.outputs[n_ys:n_ys + nv]]
        limit = self._limit(seq, n, ins)
        most = _rows_per_call(row_types)
        gv = self._chunks(n, loop, roles, nv, n_ys, len(caps), out_types, most)

        first = _Seq(self.bb)                      # the first iteration runs: the chunks
        got = first.emit(relax.Call(gv, vars_ + caps + [relax.ShapeExpr([_i64(min(256, most)), limit])]))
        first_seq = first.result(self._items(first, got, len(out_types)))

        check = _Seq(self.bb)                      # the limit allows one: the condition decides
        (pred,) = self.graph(check, cond_g, vars_ + caps)
        res = check.emit(relax.If(pred, first_seq, self._zero_steps(n, row_types, ins, out_types, 0, nv)))
        check_seq = check.result(self._items(check, res, len(out_types)))
        res = seq.emit(relax.If(limit > _i64(0), check_seq, self._zero_steps(n, row_types, ins, out_types, 0, nv)),
                       "while_loop")
        return self._items(seq, res, len(out_types))

    def _limit(self, seq, n, ins):
        """A while_loop's iteration limit as a PrimExpr (its tensor read as a shape)."""
        a = n.attrs
        if not a.has_max_tensor:
            return _i64(a.max_iterations if a.max_iterations is not None else 1 << 62)
        lim = self._int64(seq, ins[a.num_vars])
        limit = tvm.tirx.Var("limit", "int64")
        self._match(seq, seq.emit(relax.op.tensor_to_shape(lim)), relax.ShapeType([limit]))
        return limit

    def _halving_while(self, seq, n, ins):
        """A while_loop without a compiled loop, as two recursive functions (the VM's stack bounds recursion
        depth, not the iteration count): ``steps(vars, pred, caps, (k,))`` runs at most k iterations, halving k
        (a leaf runs the body once if `pred` holds), so it recurses log2(k) deep; ``chunks`` calls it with k = 1,
        2, 4, ... (at most `_WHILE_HALVING_MAX`) until the condition fails or the limit is reached. `pred`, carried
        from leaf to leaf: "not stopped yet", the condition graph then evaluated by each leaf before its iteration
        (never after the last iteration the limit allows, as the executor), or, with ``cond_in_body``, the
        body's own condition output. Per-step outputs of a shape known only when the body runs are left to the
        executor."""
        a = n.attrs
        cond_g, body = n.subgraphs
        nv = a.num_vars
        n_ys = len(n.outputs) - nv
        row_types = [v.type for v in body.outputs[:n_ys]]
        if not all(isinstance(d, int) for t in row_types for d in t.shape):
            raise CompileError(f"while_loop node {n.name!r}: per-step outputs of shapes known only when the body "
                               "runs (and no compiled loop)")
        vars_, caps = ins[:nv], ins[nv + a.has_max_tensor:]
        var_types = [v.type for v in n.inputs[:nv]]
        cap_types = [v.type for v in n.inputs[nv + a.has_max_tensor:]]
        out_types = [TensorType((0,) + tuple(t.shape), t.dtype) for t in row_types] + var_types
        limit = self._limit(seq, n, ins)
        steps = self._while_steps(n, cond_g, body, row_types, var_types, cap_types, out_types)
        chunks = self._while_chunks(n, steps, var_types, cap_types, out_types)

        check = _Seq(self.bb)                      # the limit allows one: the condition decides the first
        (pred,) = self.graph(check, cond_g, vars_ + caps) if a.cond_in_body else [_TRUE()]   # (else: in `steps`)
        got = check.emit(relax.Call(chunks, vars_ + [pred] + caps + [relax.ShapeExpr([_i64(1), limit])]), "while")
        check_seq = check.result(self._items(check, got, len(out_types)))
        res = seq.emit(relax.If(limit > _i64(0), check_seq, self._zero_steps(n, row_types, ins, out_types, 0, nv)),
                       "while_loop")
        return self._items(seq, res, len(out_types))

    def _while_steps(self, n, cond_g, body, row_types, var_types, cap_types, out_types):
        """``steps(vars..., pred, caps..., (k,))`` -> (stacked rows..., vars..., pred, count): the count of
        iterations run as an int64[1] tensor (summed by a kernel: a symbolic dim defined inside a branch is
        refused by the VM's shape lowering)."""
        nv, n_ys = len(var_types), len(row_types)
        k = tvm.tirx.Var("k", "int64")
        vars_ = [relax.Var(f"v{j}", _ty(t)) for j, t in enumerate(var_types)]
        pred = relax.Var("pred", relax.TensorType([], "bool"))
        caps = [relax.Var(f"c{j}", _ty(t)) for j, t in enumerate(cap_types)]
        params = vars_ + [pred] + caps + [relax.Var("k", relax.ShapeType([k]))]
        ret = [_ty(t) for t in out_types] + [pred.ty, relax.TensorType([1], "int64")]
        name, gv = self._recursive("while_steps", params, ret)

        def stop_seq(flag):                        # a leaf that runs nothing (the condition failed)
            stop = _Seq(self.bb)
            empty = [stop.emit(relax.op.zeros(relax.ShapeExpr([_i64(0)] + [_i64(d) for d in t.shape]), t.dtype))
                     for t in row_types]
            return stop.result(empty + vars_ + [flag, relax.const(np.array([0], np.int64), "int64")])

        run = _Seq(self.bb)                        # a leaf whose condition holds: the body once
        outs = self.graph(run, body, vars_ + caps)
        new_vars = outs[n_ys:n_ys + nv]
        (new_pred,) = outs[n_ys + nv:] if n.attrs.cond_in_body else [_TRUE()]
        stacked = [run.emit(relax.op.expand_dims(self._shaped(run, y), 0)) for y in outs[:n_ys]]
        run_seq = run.result(stacked + new_vars + [new_pred, relax.const(np.array([1], np.int64), "int64")])
        if not n.attrs.cond_in_body:               # `pred` means "not stopped yet": the condition is evaluated
            check = _Seq(self.bb)                  # here, before an iteration the limit allows (as the executor)
            (holds,) = self.graph(check, cond_g, vars_ + caps)
            res = check.emit(relax.If(holds, run_seq, stop_seq(holds)), "iteration")
            run_seq = check.result(self._items(check, res, len(ret)))
        leaf = _Seq(self.bb)
        res = leaf.emit(relax.If(pred, run_seq, stop_seq(pred)), "leaf")
        leaf_seq = leaf.result(self._items(leaf, res, len(ret)))

        two = _Seq(self.bb)                        # two halves; the second only if the condition still holds
        half = tvm.tirx.floordiv(k, _i64(2))
        first = two.emit(relax.Call(gv, vars_ + [pred] + caps + [relax.ShapeExpr([half])]), "first")
        f_items = self._items(two, first, len(ret))
        more = _Seq(self.bb)
        second = more.emit(relax.Call(gv, f_items[n_ys:n_ys + nv + 1] + caps + [relax.ShapeExpr([k - half])]), "second")
        s_items = self._items(more, second, len(ret))
        total = more.emit(relax.op.add(f_items[-1], s_items[-1]), "count")
        more_seq = more.result([self._concat(more, f_items[j], s_items[j]) for j in range(n_ys)] +
                               s_items[n_ys:n_ys + nv + 1] + [total])
        done_seq = _Seq(self.bb).result(f_items)
        res = two.emit(relax.If(f_items[n_ys + nv], more_seq, done_seq), "halves")
        two_seq = two.result(self._items(two, res, len(ret)))

        top = _Seq(self.bb)
        res = top.emit(relax.If(tvm.tirx.EQ(k, _i64(1)), leaf_seq, two_seq), "steps")
        func = relax.Function(params, top.result(self._items(top, res, len(ret))), relax.TupleType(ret), is_pure=False)
        self.recursive.append((gv, func.with_attr("global_symbol", name)))
        return gv

    def _while_chunks(self, n, steps, var_types, cap_types, out_types):
        """``chunks(vars..., pred, caps..., (k, left))`` -> (stacked rows..., vars...): `steps` of min(k, left),
        then, while the condition holds and iterations are left, itself with (2k, left - count)."""
        nv, n_ys = len(var_types), len(out_types) - len(var_types)
        k, left = tvm.tirx.Var("k", "int64"), tvm.tirx.Var("left", "int64")
        vars_ = [relax.Var(f"v{j}", _ty(t)) for j, t in enumerate(var_types)]
        pred = relax.Var("pred", relax.TensorType([], "bool"))
        caps = [relax.Var(f"c{j}", _ty(t)) for j, t in enumerate(cap_types)]
        params = vars_ + [pred] + caps + [relax.Var("chunk", relax.ShapeType([k, left]))]
        name, gv = self._recursive("while_chunks", params, [_ty(t) for t in out_types])
        seq = _Seq(self.bb)
        got = seq.emit(relax.Call(steps, vars_ + [pred] + caps + [relax.ShapeExpr([tvm.tirx.min(k, left)])]), "chunk")
        items = self._items(seq, got, len(out_types) + 2)
        count = tvm.tirx.Var("count", "int64")
        self._match(seq, seq.emit(relax.op.tensor_to_shape(items[-1])), relax.ShapeType([count]))
        more = _Seq(self.bb)
        rest = more.emit(relax.Call(gv, items[n_ys:n_ys + nv + 1] + caps + [relax.ShapeExpr(
            [tvm.tirx.min(k * _i64(2), _i64(_WHILE_HALVING_MAX)), left - count])]))
        r_items = self._items(more, rest, len(out_types))
        more_seq = more.result([self._concat(more, items[j], r_items[j]) for j in range(n_ys)] + r_items[n_ys:])
        holds = _Seq(self.bb)                      # iterations are left: the condition decides
        res = holds.emit(relax.If(items[n_ys + nv], more_seq, _Seq(self.bb).result(items[:n_ys + nv])), "more")
        holds_seq = holds.result(self._items(holds, res, len(out_types)))
        res = seq.emit(relax.If(left > count, holds_seq, _Seq(self.bb).result(items[:n_ys + nv])), "chunks")
        out = self._items(seq, res, len(out_types))
        func = relax.Function(params, seq.result(out), relax.TupleType([_ty(t) for t in out_types]), is_pure=False)
        self.recursive.append((gv, func.with_attr("global_symbol", name)))
        return gv

    def _chunks(self, n, loop, roles, nv, n_ys, n_caps, out_types, most):
        """``chunks(vars..., caps..., (cap, left))``: one call of the loop function of min(cap, left) iterations,
        then, while the condition holds and iterations are left, itself with (2 * cap, left - count)."""
        cap, left = tvm.tirx.Var("cap", "int64"), tvm.tirx.Var("left", "int64")
        params = [relax.Var(f"v{k}", _ty(t)) for k, t in enumerate(out_types[n_ys:])] + \
            [relax.Var(f"c{k}", _ty(v.type)) for k, v in enumerate(n.inputs[len(n.inputs) - n_caps:])]
        rng = relax.Var("chunk", relax.ShapeType([cap, left]))
        name, gv = self._recursive("while", params + [rng], [_ty(t) for t in out_types])
        vars_, caps = params[:nv], params[nv:]
        seq = _Seq(self.bb)
        rows = tvm.tirx.min(cap, left)
        args = [vars_[k] if r == "state" else caps[k] for r, k in roles]
        res = seq.emit(relax.Call(loop, args + [relax.ShapeExpr([rows])]), "loop")
        ctl = self._match(seq, seq.emit(relax.TupleGetItem(res, n_ys + nv)), relax.TensorType([2], "int64"))
        count, go = tvm.tirx.Var("count", "int64"), tvm.tirx.Var("go", "int64")
        self._match(seq, seq.emit(relax.op.tensor_to_shape(ctl)), relax.ShapeType([count, go]))
        ys = [seq.emit(relax.op.strided_slice(self._shaped(seq, seq.emit(relax.TupleGetItem(res, k))), [0], [_i64(0)],
                                              [count]))
              for k in range(n_ys)]
        new_vars = [seq.emit(relax.TupleGetItem(res, n_ys + k)) for k in range(nv)]

        more = _Seq(self.bb)
        rest = more.emit(relax.Call(gv, new_vars + caps + [relax.ShapeExpr([tvm.tirx.min(cap * _i64(2), _i64(most)),
                                                                             left - count])]))
        more_seq = more.result([self._concat(more, y, more.emit(relax.TupleGetItem(rest, k)))
                                for k, y in enumerate(ys)] +
                               [more.emit(relax.TupleGetItem(rest, n_ys + k)) for k in range(nv)])
        done = _Seq(self.bb).result(ys + new_vars)
        go_on = tvm.tirx.And(tvm.tirx.And(go != _i64(0), tvm.tirx.EQ(count, rows)), left > count)
        out = seq.emit(relax.If(go_on, more_seq, done), "chunks")
        func = relax.Function(params + [rng], seq.result(self._items(seq, out, len(out_types))),
                              _ret_ty(out_types), is_pure=False)
        self.recursive.append((gv, func.with_attr("global_symbol", name)))
        return gv

    def _zero_steps(self, n, row_types, ins, out_types, first: int, count: int):
        """The result of no step: empty stacks and the initial states (``ins[first:first + count]``), or (a
        per-step output whose shape is not static) a call that makes the runtime run the model in the
        executor."""
        seq = _Seq(self.bb)
        if all(isinstance(d, int) for t in row_types for d in t.shape):
            # (zeros made when they run: a library holding a constant of no element does not load)
            ys = [seq.emit(relax.op.zeros(relax.ShapeExpr([_i64(0)] + [_i64(d) for d in t.shape]), t.dtype))
                  for t in row_types]
            return seq.result(ys + ins[first:first + count])
        call = relax.Call(relax.ExternFunc(FALLBACK_CALLBACK), [tvm.ir.StringImm(
            f"{n.op} node {n.name!r}: zero steps with per-step outputs of shapes known only when the body runs")],
            ty_args=[_ret_ty(out_types)])
        res = seq.emit(call, "fallback")
        return seq.result(self._items(seq, res, len(out_types)))


def _foreach_signature(n):
    """A foreach node's counts (data, states, per-step outputs), its per-step output types, the types of its
    results (stacks first), the range vars ``lo``, ``hi`` and the parameters of its recursive function."""
    a, body = n.attrs, n.subgraphs[0]
    nd, ns = a.num_data, a.num_states
    n_ys = len(body.outputs) - ns
    row_types = [v.type for v in body.outputs[:n_ys]]
    out_types = [TensorType((0,) + tuple(t.shape), t.dtype) for t in row_types] + \
        [v.type for v in body.outputs[n_ys:]]
    lo, hi = tvm.tirx.Var("lo", "int64"), tvm.tirx.Var("hi", "int64")
    params = [relax.Var(f"in{i}", _ty(v.type)) for i, v in enumerate(n.inputs)]
    return nd, ns, n_ys, row_types, out_types, lo, hi, params
