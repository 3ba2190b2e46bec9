"""The ONNX converters for control flow (`If`, `Loop`, `Scan`) and recurrent layers (`LSTM`, `GRU`), registered
into `onnx_ops.CONVERTERS` like the others: `If` -> `F.cond`, `Loop` -> `F.while_loop`, `Scan`, `LSTM` and
`GRU` -> `F.foreach` (the recurrent layers' input GEMM hoisted out of the loop)."""
from __future__ import annotations

import numpy as np

from dyntvm.errors import TraceError

from . import F, onnx_seq
from . import onnx_seq_runtime as seq_rt
from .onnx_ops import OnnxImportError, _is_const, _rank, _scalar_bool, _shape, converter


# ------------------------------------------------------------------------------------- control flow
@converter("If")
def _if(ins, a, ctx, env, node):
    pred = ins[0]
    then_g, else_g = a["then_branch"].g, a["else_branch"].g
    nt, ne, nn = len(then_g.output), len(else_g.output), len(node.output)
    if not nt == ne == nn:
        raise OnnxImportError(f"If: the then branch yields {nt} output{'s' * (nt != 1)}, the else branch {ne}, the "
                              f"node names {nn} (they must match)")
    if _is_const(pred):
        outs = ctx.run_graph(then_g if bool(np.asarray(pred).reshape(-1)[0]) else else_g, env, [])
        return outs
    seen: list = []         # sequences / optionals in the outputs: the same structure in both branches
    try:
        with seq_rt.rollback():
            res = F.cond(_scalar_bool(pred), lambda: onnx_seq.cond_branch(ctx.run_graph(then_g, env, []), seen),
                         lambda: onnx_seq.cond_branch(ctx.run_graph(else_g, env, []), seen))
    except OnnxImportError as e:    # sequences of different lengths (or one known only at run time): run-time lists
        if "different lengths" not in str(e):
            raise
        res = F.cond(_scalar_bool(pred), lambda: seq_rt.runtime_outputs(ctx.run_graph(then_g, env, []), then_g),
                     lambda: seq_rt.runtime_outputs(ctx.run_graph(else_g, env, []), else_g))
    return list(res) if isinstance(res, (list, tuple)) else [res]


@converter("Loop")
def _loop(ins, a, ctx, env, node):
    body = a["body"].g
    if not any(onnx_seq.is_structured(v) for v in ins[2:]) or any(seq_rt.is_runtime(v) for v in ins[2:]):
        return _as_while_loop(ins, a, ctx, env, node)
    check_loop_body(body, len(ins) - 2, node)        # carries a sequence / optional: unrolled if it can be
    try:
        with seq_rt.rollback():
            return onnx_seq.unroll_loop(ins, a, ctx, env, node)
    except OnnxImportError as e:
        if not any(w in str(e) for w in (onnx_seq.KNOWN, "unrolled when the model is imported")) or \
                any(v is onnx_seq.EMPTY for v in ins[2:]):
            raise
        why = e
    try:                                             # else a loop carrying run-time lists
        return _as_while_loop(ins[:2] + seq_rt.runtime_carries(
            list(ins[2:]), body, lambda: ctx.run_graph(body, env, [np.asarray(0, np.int64), np.asarray(True),
                                                                   *ins[2:]])), a, ctx, env, node)
    except (OnnxImportError, TraceError) as e:
        raise OnnxImportError(f"{why}; as a loop carrying run-time lists it does not convert either: {e}") from None


def _as_while_loop(ins, a, ctx, env, node):
    body = a["body"].g
    trip, cond0, carried = ins[0], ins[1], list(ins[2:])
    n_carried = len(carried)
    n_scan = len(body.output) - 1 - n_carried
    check_loop_body(body, n_carried, node)
    i0 = np.asarray(0, dtype=np.int64)
    c0 = np.asarray(True) if cond0 is None else (F.reshape(cond0, ()) if not _is_const(cond0)
                                                  else np.asarray(bool(np.asarray(cond0).reshape(-1)[0])))
    max_it = None
    if trip is not None:
        max_it = int(np.asarray(trip).reshape(-1)[0]) if _is_const(trip) else F.reshape(trip, ())

    def cond_fn(i, c, *vs):
        return c

    def body_fn(i, c, *vs):
        outs = ctx.run_graph(body, env, [i, c, *vs])
        # without a condition input the loop is a for loop: the body's condition output is ignored (spec)
        c_new = np.asarray(True) if cond0 is None else _scalar_bool(outs[0])
        if _is_const(c_new):
            c_new = F.full((), bool(np.asarray(c_new)), dtype="bool")
        new = [seq_rt.carried_like(v, init) for v, init in zip(outs[1:1 + n_carried], carried)]
        return tuple(outs[1 + n_carried:]), [i + np.asarray(1, np.int64), c_new, *new]
    init = [F.full((), v.item(), dtype=v.dtype.name) if _is_const(v) and np.ndim(v) == 0 else v
            for v in [i0, c0, *carried]]
    try:
        scans, final = F.while_loop(cond_fn, body_fn, init, max_iterations=max_it)
    except OnnxImportError as e:        # the body needs its iteration number at import: unrolled, where it can be
        if not onnx_seq.can_unroll(e, ins):
            raise
        return onnx_seq.unroll_loop(ins, a, ctx, env, node)
    scans = list(scans) if isinstance(scans, (list, tuple)) else [scans]
    return list(final[2:]) + scans[:n_scan]


def check_loop_body(body, n_carried: int, node):
    """A Loop's body yields its condition, the loop-carried values and the scan outputs; the node names the
    carried values' finals and the scan outputs."""
    n_out = len(body.output)
    if n_out < 1 + n_carried:
        raise OnnxImportError(f"Loop's body has {n_out} output{'s' * (n_out != 1)}, it needs {1 + n_carried} at "
                              f"least (the condition and {n_carried} loop-carried value{'s' * (n_carried != 1)})")
    if len(node.output) != n_out - 1:
        raise OnnxImportError(f"the Loop names {len(node.output)} outputs, its body yields {n_out - 1} besides the "
                              f"condition ({n_carried} loop-carried, {n_out - 1 - n_carried} scan outputs)")


def _check_scan(ins, a, node, n_states_in: int):
    """num_scan_inputs within the inputs, the node's outputs as many as the body's."""
    n_in = a["num_scan_inputs"]
    if not 1 <= n_in <= n_states_in:
        raise OnnxImportError(f"Scan: num_scan_inputs {n_in} must be in [1, {n_states_in}] (the node has "
                              f"{n_states_in} state and scan inputs)")
    body = a["body"].g
    if len(node.output) != len(body.output):
        raise OnnxImportError(f"the Scan names {len(node.output)} outputs, its body yields {len(body.output)}")
    return n_in


@converter("Scan")
def _scan(ins, a, ctx, env, node):
    if ctx.opset < 9:
        _check_scan(ins, a, node, len(ins) - 1)
        return _scan8(ins, a, ctx, env, node)
    body = a["body"].g
    n_in = _check_scan(ins, a, node, len(ins))
    states, xs = list(ins[:len(ins) - n_in]), list(ins[len(ins) - n_in:])
    in_axes = a.get("scan_input_axes") or [0] * n_in
    in_dirs = a.get("scan_input_directions") or [0] * n_in
    xs = [_to_front(x, ax, d) for x, ax, d in zip(xs, in_axes, in_dirs)]
    n_states = len(states)

    def step(rows, sts):
        outs = ctx.run_graph(body, env, [*sts, *rows])
        return tuple(outs[n_states:]), list(outs[:n_states])
    ys, final = F.foreach(step, xs, states)
    ys = list(ys) if isinstance(ys, (list, tuple)) else [ys]
    n_out = len(ys)
    out_axes = a.get("scan_output_axes") or [0] * n_out
    out_dirs = a.get("scan_output_directions") or [0] * n_out
    ys = [_from_front(y, ax, d) for y, ax, d in zip(ys, out_axes, out_dirs)]
    return list(final) + ys


def _scan8(ins, a, ctx, env, node):
    """Scan of opset 8: the batch form (axis 0 of every state and scan input is the batch, axis 1 of the scan
    inputs the sequence). An outer foreach over the batch runs, per batch entry, the same foreach over the
    sequence as opset 9's Scan; stacking its results restores the batch axis of the final states ([B, ...]) and
    scan outputs ([B, T, ...])."""
    if ins[0] is not None:
        raise OnnxImportError("Scan (opset 8) with sequence_lens is not supported (only full-length sequences: "
                              "leave the input empty)")
    body = a["body"].g
    n_in = a["num_scan_inputs"]
    states, xs = list(ins[1:len(ins) - n_in]), list(ins[len(ins) - n_in:])
    dirs = a.get("directions") or [0] * n_in
    n_states = len(states)

    def per_batch(rows, _):
        sts, seqs = list(rows[:n_states]), [_to_front(x, 0, d) for x, d in zip(rows[n_states:], dirs)]

        def step(steps, carried):
            outs = ctx.run_graph(body, env, [*carried, *steps])
            return tuple(outs[n_states:]), list(outs[:n_states])
        ys, final = F.foreach(step, seqs, sts)
        ys = list(ys) if isinstance(ys, (list, tuple)) else [ys]
        return tuple(final) + tuple(ys), []
    res, _ = F.foreach(per_batch, states + xs, [])
    return list(res) if isinstance(res, (list, tuple)) else [res]


def _axis(axis, r, what):
    if not -r <= axis < r:
        raise OnnxImportError(f"Scan: {what} axis {axis} is out of range for rank {r}")
    return axis % r


def _to_front(x, axis, reverse):
    axis = _axis(axis, _rank(x), "scan input")
    if axis:
        perm = [axis] + [i for i in range(_rank(x)) if i != axis]
        x = F.transpose(x, tuple(perm))
    return F.slice(x, [None], [None], [-1]) if reverse else x


def _from_front(y, axis, reverse):
    if reverse:
        y = F.slice(y, [None], [None], [-1])
    axis = _axis(axis, _rank(y), "scan output")
    if axis:
        perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, _rank(y)))
        y = F.transpose(y, tuple(perm))
    return y


# ------------------------------------------------------------------------------------ recurrent layers
def _rnn_setup(ins, a, node, gates: int):
    """The shared inputs of LSTM / GRU, per direction: X @ W^T + Wb hoisted out of the loop (one GEMM over all
    steps), R^T, Rb, initial state(s); refuses the forms not supported."""
    if a.get("layout", 0):
        raise OnnxImportError(f"{node.op_type} with layout=1 (batch first) is not supported")
    if "clip" in a or a.get("input_forget", 0) or (len(ins) > 7 and ins[7] is not None):
        raise OnnxImportError(f"{node.op_type} with clip, input_forget or peepholes is not supported")
    acts = [x.decode() if isinstance(x, bytes) else x for x in a.get("activations", [])]
    default = ["Sigmoid", "Tanh", "Tanh"] if node.op_type == "LSTM" else ["Sigmoid", "Tanh"]
    if acts and acts != default * (len(acts) // len(default)):
        raise OnnxImportError(f"{node.op_type} with activations {acts} is not supported (only the defaults)")
    direction = a.get("direction", b"forward")
    direction = direction.decode() if isinstance(direction, bytes) else direction
    x, w, r = ins[0], ins[1], ins[2]
    b = ins[3] if len(ins) > 3 else None
    lens = ins[4] if len(ins) > 4 else None
    if lens is not None and direction != "forward":
        raise OnnxImportError(f"{node.op_type} with sequence_lens is supported in the forward direction only")
    hidden = a["hidden_size"]
    dirs = []
    for d in range(2 if direction == "bidirectional" else 1):
        wd, rd = F.take(w, np.int64(d)), F.take(r, np.int64(d))
        xs = x
        if direction == "reverse" or d == 1:
            xs = F.slice(x, [None], [None], [-1])
        wb = rb = None
        if b is not None:
            bd = F.take(b, np.int64(d))
            wb, rb = F.slice(bd, [0], [gates * hidden]), F.slice(bd, [gates * hidden], [2 * gates * hidden])
        xw = F.matmul(xs, F.transpose(wd))
        dirs.append(dict(xw=xw, rt=F.transpose(rd), wb=wb, rb=rb, reverse=direction == "reverse" or d == 1, d=d))
    return dirs, lens, hidden


def _initial(ins, k, d, x, hidden):
    """Direction `d`'s initial state from input `k`, else zeros [batch, hidden] (batch read off x: a symbol
    works, T = 0 too)."""
    if len(ins) > k and ins[k] is not None:
        return F.take(ins[k], np.int64(d))
    batch = _shape(x)[1]
    if isinstance(batch, int):
        return F.zeros((batch, hidden), dtype=np.dtype(x.dtype).name)
    return F.zeros_like(F.matmul(F.sum(x, axis=0), np.zeros((_shape(x)[2], hidden), x.dtype)))


def _rnn_outputs(node, ys: list, finals: list):
    """Y [T, dirs, B, H] and each final state [dirs, B, H] (outputs not asked for are computed anyway)."""
    y = F.stack(ys, axis=1)
    return [y] + [F.stack(list(f), axis=0) for f in zip(*finals)]


@converter("LSTM")
def _lstm(ins, a, ctx, env, node):
    dirs, lens, hidden = _rnn_setup(ins, a, node, 4)
    x = ins[0]
    ys, finals = [], []
    for dd in dirs:
        xw = dd["xw"] if dd["wb"] is None else dd["xw"] + dd["wb"] + dd["rb"]
        rt = dd["rt"]

        def step(g_x, states, rt=rt):
            h, c = states
            g = g_x + F.matmul(h, rt)
            i, o, f, cc = F.split(g, 4, axis=-1)
            c2 = F.sigmoid(f) * c + F.sigmoid(i) * F.tanh(cc)
            h2 = F.sigmoid(o) * F.tanh(c2)
            return h2, [h2, c2]
        h0, c0 = _initial(ins, 5, dd["d"], x, hidden), _initial(ins, 6, dd["d"], x, hidden)
        y, (h, c) = F.foreach(step, xw, [h0, c0], valid_length=lens)
        ys.append(F.slice(y, [None], [None], [-1]) if dd["reverse"] else y)
        finals.append((h, c))
    return _rnn_outputs(node, ys, finals)


@converter("GRU")
def _gru(ins, a, ctx, env, node):
    dirs, lens, hidden = _rnn_setup(ins, a, node, 3)
    x = ins[0]
    before = bool(a.get("linear_before_reset", 0))
    ys, finals = [], []
    for dd in dirs:
        xw = dd["xw"] if dd["wb"] is None else dd["xw"] + dd["wb"]
        rt = dd["rt"]
        rb = dd["rb"] if dd["rb"] is not None else np.zeros(3 * hidden, x.dtype)
        rt_zr, rt_h = F.slice(rt, [0], [2 * hidden], [1], [1]), F.slice(rt, [2 * hidden], [3 * hidden], [1], [1])
        rb_zr, rb_h = F.slice(rb, [0], [2 * hidden]), F.slice(rb, [2 * hidden], [3 * hidden])

        def step(g_x, states, rt_zr=rt_zr, rt_h=rt_h, rb_zr=rb_zr, rb_h=rb_h):
            (h,) = states
            xz, xr, xh = F.split(g_x, 3, axis=-1)
            hz, hr = F.split(F.matmul(h, rt_zr) + rb_zr, 2, axis=-1)
            z, r = F.sigmoid(xz + hz), F.sigmoid(xr + hr)
            if before:
                hh = F.tanh(xh + r * (F.matmul(h, rt_h) + rb_h))
            else:
                hh = F.tanh(xh + F.matmul(r * h, rt_h) + rb_h)
            h2 = (np.asarray(1, x.dtype) - z) * hh + z * h
            return h2, [h2]
        y, (h,) = F.foreach(step, xw, [_initial(ins, 5, dd["d"], x, hidden)], valid_length=lens)
        ys.append(F.slice(y, [None], [None], [-1]) if dd["reverse"] else y)
        finals.append((h,))
    return _rnn_outputs(node, ys, finals)
