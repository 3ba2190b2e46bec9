"""Compiled loops: one TIR function runs every step of a `foreach` or `while_loop`, calling the body's kernels.

For each loop `ir.compiled_loop.foreach_loop_plan` / `while_loop_plan` accepts, the module pass
`add_compiled_loops` reads the body region's Relax function after fusion and scheduling — a sequence of
``call_tir`` kernel calls — and adds two functions:

* a PrimFunc ``<region>__loop_kernel`` with a serial loop over the steps (a foreach: ``for t in range(n)``; a
  while_loop: ``while count < cap and condition``, the condition being the body's last output) whose body
  calls each kernel with ``T.call_cpacked`` (a direct C call of the kernel's packed entry, no lookup), passing
  DLTensors built on the stack: data rows are addresses inside the sequence (``&xs[t, 0, ...]``), per-step
  outputs are written straight into their row of the stacked output, intermediates live in buffers allocated
  once per call, and each new state is either the stacked-output row it was written to (read back at the next
  step) or one of two buffers used alternately, so no step copies a state;
* a public Relax function ``<region>__loop`` (the name the executor looks up) that calls it with
  ``call_tir``, allocating the stacked outputs ``[n, ...]`` and the final states (a while_loop: also the
  ``(count, go)`` pair; see `ir.compiled_loop`).

A step then costs its kernels and about a hundred nanoseconds of argument setup, against a region call from
Python and the executor's bookkeeping (the LSTM's B=1 step: 6.2 us in the loop, 9.1 us as a region call
from Python plus 1.5-2 us of executor).

Kernels assume 64-byte aligned data: a data row or per-step output that is not a provable multiple of 64 bytes
(a 0-d token, a row of 4 floats) goes through a buffer of its own, copied in / out each step by the loop
function. Shapes must be products/sums of the body's dims. Any other pattern (a Relax op that is not a kernel
call, a state that changes shape, a value returned twice) declines the loop: the executor then runs it step
by step.

The device loop (``<region>__dloop``, `build_loop`'s `device`; built for CUDA libraries, and for the CPU where
tests ask, see `build._loop_specs`) is the same function written for a device (`loop_buffers`): its host part
only does pointer arithmetic and launches, its copies are kernels, and a while_loop runs all `cap` steps with
``(count, go)`` kept on the device (`ir.compiled_loop`), its states in rings of ``cap + 1`` rows, and a GPU's
run-time checks summed on the device (`_DeviceChecks`).
"""
from __future__ import annotations

import tvm
from tvm import relax

from ..ir.compiled_loop import compiled_loop_name
from .loop_buffers import (Decline, _element, _expr, _is_aligned, _Loc, _Names, _Ring, _tensor_type, copy_lines,
                           elementwise, select_copy_lines)

def _alias(region: str, kernel: str) -> str:
    """The name of the region's copy of `kernel` that its loop functions call (a kernel already copied by the
    region's other loop function, host or device, is that copy)."""
    prefix = f"{region}__loop__"
    return kernel if kernel.startswith(prefix) else prefix + kernel


def _prim_name(region: str, device) -> str:
    return f"{region}__{'d' if device is not None else ''}loop_kernel"


def _analyze(func, names: _Names):
    """The body's kernel calls: ``(calls, value_of, consts, region_outs)``; `calls` are (kernel, [arg values],
    [out types], [tir scalar args]); a value is ``("param", i)``, ``("call", k, j)``, ``("const", k)`` or
    ``("scalar", expr)``."""
    seq = func.body
    if len(seq.blocks) != 1:
        raise Decline("more than one binding block")
    value_of = {p: ("param", i) for i, p in enumerate(func.params)}
    calls, consts = [], []

    def resolve(x):
        if isinstance(x, relax.Var) and x in value_of:
            return value_of[x]
        kind = type(x).__name__
        if kind == "PrimValue":
            x, kind = x.value, type(x.value).__name__
        if kind in ("IntImm", "Var") and str(getattr(x, "dtype", "int64")) == "int64":
            return ("scalar", x)                      # an int64 argument (an axis length, say)
        if type(x).__name__ in ("GenericConst", "Constant"):
            for k, c in enumerate(consts):
                if c.same_as(x):
                    return ("const", k)
            consts.append(x)
            return ("const", len(consts) - 1)
        raise Decline(f"an argument that is not a tensor of the body: {type(x).__name__}")

    call_tir = tvm.ir.Op.get("relax.call_tir")
    checks = _DeviceChecks() if names.device is not None else None
    for b in seq.blocks[0].bindings:
        if checks is not None and checks.take(b, resolve, calls, value_of):
            continue
        if not isinstance(b, relax.VarBinding):
            raise Decline("a match_cast binding")
        v = b.value
        if isinstance(v, relax.Call) and v.op.same_as(call_tir):
            args = [resolve(x) for x in v.args[1].fields]
            scalars = list(v.args[2].values) if len(v.args) > 2 else []
            out_ty = v.ty
            multi = isinstance(out_ty, tvm.ir.TupleType)
            calls.append((v.args[0].name_hint, args, [_tensor_type(t) for t in (out_ty.fields if multi else [out_ty])],
                          scalars))
            value_of[b.var] = ("call", len(calls) - 1, None if multi else 0)
        elif isinstance(v, relax.TupleGetItem) and v.tuple_value in value_of:
            src = value_of[v.tuple_value]
            if src[0] != "call" or src[2] is not None:
                raise Decline("a tuple projection of something other than a multi-output kernel")
            value_of[b.var] = ("call", src[1], int(v.index))
        elif isinstance(v, relax.Tuple):
            value_of[b.var] = ("tuple", [resolve(x) for x in v.fields])
        elif isinstance(v, relax.Var) and v in value_of:
            value_of[b.var] = value_of[v]
        else:
            raise Decline(f"a Relax binding that is not a kernel call: {type(v).__name__}")
    result = seq.body
    res = value_of.get(result) if isinstance(result, relax.Var) else None
    if res is None and isinstance(result, relax.Tuple):
        res = ("tuple", [resolve(x) for x in result.fields])
    if res is None:
        raise Decline("the body's result is not a tuple of its values")
    region_outs = res[1] if res[0] == "tuple" else [res]
    if any(o[0] != "call" or o[2] is None for o in region_outs):
        raise Decline("a body output that is not a kernel output")
    return calls, consts, region_outs


class _DeviceChecks:
    """A GPU's run-time checks in a body (`converters.common.checked`): a kernel counts the bad values into
    ``bad`` [1], ``R.tensor_to_shape(bad)`` and a match_cast read it to the host as a dim ``k``, and
    ``dt_pass_*(x, k)`` asserts k == 0 there before passing `x` on. A device loop keeps the count on the
    device instead: the pass becomes a pseudo-call ``SANITIZE(x, bad)`` (x where bad is 0, else zeros, so a
    failed step reads no memory out of range: index 0) and the loop adds `bad` up in ``ctl[2]``; the caller
    runs the loop again step by step, which raises the check's error, when it is not 0."""

    def __init__(self):
        self.shape_of, self.bad_of = {}, []         # tensor_to_shape var -> bad value; [(dim k, bad value)]

    def take(self, b, resolve, calls, value_of) -> bool:
        v = b.value
        if isinstance(b, relax.MatchCast):
            dims = getattr(b.var.ty, "values", None)
            if v in self.shape_of and dims is not None and len(dims) == 1 and type(dims[0]).__name__ == "Var":
                self.bad_of.append((dims[0], self.shape_of[v]))
                return True
            return False
        if not isinstance(v, relax.Call):
            return False
        if v.op.same_as(tvm.ir.Op.get("relax.tensor_to_shape")):
            bad = resolve(v.args[0])
            shape, dtype = calls[bad[1]][2][bad[2]] if bad[0] == "call" and bad[2] is not None else ([], "")
            if dtype != "int64" or len(shape) != 1 or not isinstance(shape[0], tvm.tirx.IntImm) or shape[0].value != 1:
                raise Decline("a tensor read to the host that is not a run-time check's count")
            if any(not isinstance(x, tvm.tirx.IntImm) for x in calls[bad[1]][3]):
                raise Decline("a run-time check over a size known only at run time")
            self.shape_of[b.var] = bad
            return True
        fields = v.args[1].fields if len(v.args) > 1 and isinstance(v.args[1], relax.Tuple) else []
        k = None if len(fields) != 2 else fields[1].value if type(fields[1]).__name__ == "PrimValue" else fields[1]
        bad = [key for var, key in self.bad_of if k is not None and var.same_as(k)]      # (tirx vars: no hash)
        if isinstance(v.args[0], tvm.ir.GlobalVar) and v.args[0].name_hint.startswith("dt_pass_") and bad:
            src = resolve(fields[0])
            if src[0] != "call":
                raise Decline("a run-time check of a value that is not a kernel output")
            calls.append((SANITIZE, [src, bad[0]], [_tensor_type(v.ty)], []))
            value_of[b.var] = ("call", len(calls) - 1, 0)
            return True
        return False


SANITIZE = "@sanitize"          # a pseudo-kernel of `_DeviceChecks`


def build_loop(mod: tvm.IRModule, region: str, roles: tuple, outs: tuple, n_ys: int, kind: str = "foreach",
               device: str | None = None):
    """(TVMScript text of the loop PrimFunc, the Relax constants it takes, its output types, the kernel calls)
    for one loop, or raises Decline. `kind`: "foreach" (`n` = the data rows) or "while" (`outs` ends with the
    condition; `n` = the capacity of the stacked outputs, see `ir.compiled_loop`). `device`: None for the
    host loop, "cpu" / "cuda" for the device loop (`loop_buffers`; a while_loop's steps then all run, the
    condition kept on the device, see `ir.compiled_loop`)."""
    func = mod[region]
    if not isinstance(func, relax.Function):
        raise Decline("the body is not a Relax function")
    steps_var = tvm.tirx.Var("n", "int64")
    names = _Names(device, steps_var)
    is_while = kind == "while"
    ahead = is_while and device is not None         # steps after the condition failed run, masked
    n_states = len(outs) - n_ys - is_while
    params = list(func.params)
    ptypes = [_tensor_type(p.ty) for p in params]
    calls, consts, region_outs = _analyze(func, names)
    checks = [args[1] for kernel, args, _, _ in calls if kernel == SANITIZE]
    if checks and not ahead:    # a foreach would read the counts at its end only: after a failed step's kernels
        raise Decline("run-time checks (a GPU's) in a foreach body")

    # ---- which kernel output gives each per-step output, new state and the condition
    ys_of, state_of = {}, {}
    def key_of(out):            # (call, j); ("prev", s): state s as the step got it; ("row", k): data row k
        kind, k = out
        if kind == "region":
            return tuple(region_outs[k][1:])
        if kind == "state":
            return ("prev", k)
        data = [i for i, r in enumerate(roles) if r == ("data", k)]
        if not data:
            raise Decline("a per-step output that is a data row the body does not read")
        return ("row", data[0])
    for k in range(n_ys):
        key = key_of(outs[k])
        if key in ys_of.values():
            raise Decline("a value stacked twice")
        ys_of[k] = key
    if any(o[0] != "region" for o in outs[n_ys:]):
        raise Decline("a state passed through unchanged")
    for s in range(n_states):
        key = tuple(region_outs[outs[n_ys + s][1]][1:])
        if key in state_of.values():
            raise Decline("one value as two states")
        state_of[s] = key
    cond_key = tuple(region_outs[outs[-1][1]][1:]) if is_while else None
    if cond_key is not None and calls[cond_key[0]][2][cond_key[1]] != ([], "bool"):
        raise Decline("the condition is not a 0-d bool")
    state_param = {k: i for i, (role, k) in enumerate(roles) if role == "state"}

    # ---- the PrimFunc's parameters; data rows and per-step outputs kernels cannot address in place (not
    # 64-byte multiples: kernels assume aligned data) go through a buffer of their own, copied each step
    lines_params, lines_match = [], []
    scratch = []                                      # (name, shape, dtype): allocated once per call by the VM
    loc_param, copy_in = {}, []                       # param i -> _Loc; (scratch name, param i, shape)
    for i, ((role, _), (shape, dtype)) in enumerate(zip(roles, ptypes)):
        full = (["n"] if role == "data" else []) + [_expr(d, names) for d in shape]
        lines_params.append(f"h_p{i}: T.handle")
        lines_match.append(f"p{i} = T.match_buffer(h_p{i}, ({', '.join(full)},), \"{dtype}\")"
                           if full else f"p{i} = T.match_buffer(h_p{i}, (), \"{dtype}\")")
        if role == "data" and not _is_aligned(shape, dtype):
            scratch.append((f"x{i}", shape, dtype))
            copy_in.append((f"x{i}", i, shape))
            loc_param[i] = _Loc(f"x{i}", shape, dtype, row=False)
        else:
            loc_param[i] = _Loc(f"p{i}", shape, dtype, row=(role == "data"))
    const_types = [_tensor_type(c.ty) for c in consts]
    for k, (shape, dtype) in enumerate(const_types):
        lines_params.append(f"h_k{k}: T.handle")
        dims = ", ".join(_expr(d, names) for d in shape)
        lines_match.append(f"k{k} = T.match_buffer(h_k{k}, ({dims},), \"{dtype}\")" if shape else
                           f"k{k} = T.match_buffer(h_k{k}, (), \"{dtype}\")")
    if is_while:                # the capacity: a scalar argument (no buffer need have n rows)
        lines_params.append("n: T.int64")
    out_types = []
    for s in range(n_states):
        i = state_param[s]
        shape, dtype = ptypes[i]
        c, j = state_of[s]
        nshape, ndtype = calls[c][2][j]
        ana = tvm.sym.Analyzer()
        if ndtype != dtype or len(nshape) != len(shape) or not all(
                ana.can_prove_equal(a, b) for a, b in zip(nshape, shape)):
            raise Decline("a state whose new value has another shape or dtype")
    state_key = {v: s for s, v in state_of.items()}
    loc_out, copy_out = {}, []                        # (call, j) -> _Loc of its row; [(y name, (call, j), shape)]
    for k in range(n_ys):
        c, j = ys_of[k]
        shape, dtype = ptypes[state_param[j]] if c == "prev" else ptypes[j] if c == "row" else calls[c][2][j]
        lines_params.append(f"h_y{k}: T.handle")
        dims = ", ".join(["n"] + [_expr(d, names) for d in shape])
        lines_match.append(f"y{k} = T.match_buffer(h_y{k}, ({dims},), \"{dtype}\")")
        # a state stacked as computed lives in its rows (read back at the next step: no copy), unless it is
        # also stacked as it came in (that per-step output reads the two-row buffer)
        if c not in ("prev", "row") and _is_aligned(shape, dtype) and \
                ((c, j) not in state_key or ("prev", state_key[(c, j)]) not in ys_of.values()):
            loc_out[(c, j)] = _Loc(f"y{k}", shape, dtype, row=True)
        else:                                         # written elsewhere, copied into its row
            copy_out.append((f"y{k}", (c, j), shape))
        out_types.append((["n"] + shape, dtype))
    for s in range(n_states):
        shape, dtype = ptypes[state_param[s]]
        lines_params.append(f"h_f{s}: T.handle")
        dims = ", ".join(_expr(d, names) for d in shape)
        lines_match.append(f"f{s} = T.match_buffer(h_f{s}, ({dims},), \"{dtype}\")" if shape else
                           f"f{s} = T.match_buffer(h_f{s}, (), \"{dtype}\")")
        out_types.append((shape, dtype))
    if is_while:                                      # (iterations run, condition after the last one)
        lines_params.append("h_ctl: T.handle")
        # (iterations, condition), and in a device loop the failed run-time checks' count
        lines_match.append(f"ctl = T.match_buffer(h_ctl, (T.int64({2 + ahead}),), \"int64\")")
        out_types.append(([2 + ahead], "int64"))

    # ---- buffers allocated once (by the VM, as extra outputs of the call: TIR allocations inside the loop
    # function were seen to crash the kernels at small sizes): intermediates, and per state not kept in its
    # stacked rows two rows, padded to 64 bytes, in one flat buffer: step t writes row t % 2 and reads the
    # previous value in row (t + 1) % 2 (row 1 starts as the initial state), so no step copies a state. A
    # call reading a state kept in its stacked rows reads row t - 1, and at step 0 the initial state (the
    # only calls whose text differs at step 0)
    loc_tmp, loc_state = {}, {}                       # (call, j) -> _Loc; state s -> _Ring
    in_rows = {}                                      # state s -> the _Loc of the stacked rows it lives in
    for c, (_, _, otypes, _) in enumerate(calls):
        for j, (shape, dtype) in enumerate(otypes):
            key = (c, j)
            if key in loc_out:
                if key in state_key:
                    in_rows[state_key[key]] = loc_out[key]
                continue
            if key in state_key:
                st = _Ring(f"s{state_key[key]}", shape, dtype, names, steps_var + 1 if ahead else 2)
                scratch.append((st.buf, [st.size()], dtype))
                loc_state[state_key[key]] = st
            else:
                scratch.append((f"t{c}_{j}", shape, dtype))
                loc_tmp[key] = _Loc(f"t{c}_{j}", shape, dtype, row=False)

    def written(key):
        """Where a kernel output is written at step t: (_Loc-like, row expression or None); ("prev", s): where
        state s's value before step t is."""
        if key[0] == "prev":
            return loc_state[key[1]], loc_state[key[1]].before("t")
        if key[0] == "row":
            return loc_param[key[1]], "t"
        if key in loc_out:
            return loc_out[key], "t"
        if key in loc_tmp:
            return loc_tmp[key], None
        return loc_state[state_key[key]], "t"

    def arg_of(value, first=False):
        """The argument for a body value at step t (`first`: at step 0, where it may differ)."""
        if value[0] == "scalar":
            return _expr(value[1], names)
        if value[0] == "const":
            shape, dtype = const_types[value[1]]
            return _Loc(f"k{value[1]}", shape, dtype, row=False).arg(None, names)
        if value[0] == "param":
            i = value[1]
            role, k = roles[i]
            if role == "state" and k in in_rows:      # the previous row; the initial state at step 0
                return loc_param[i].arg(None, names) if first else in_rows[k].arg("(t - T.int64(1))", names)
            if role == "state":                       # the previous step's value
                return loc_state[k].arg(loc_state[k].before("t"), names)
            return loc_param[i].arg("t", names)       # a data row (or its copy), a capture
        loc, row = written((value[1], value[2]))
        return loc.arg(row, names)

    step = []
    for name, i, shape in copy_in:
        step += copy_lines(name, None, f"p{i}", "t", shape, names)
    for c, (kernel, args, otypes, scalars) in enumerate(calls):
        if kernel == SANITIZE:
            (src_loc, src_row), (bad_loc, bad_row) = (written(v[1:]) for v in args)
            dst_loc, dst_row = written((c, 0))
            bad = _element(bad_loc, bad_row, ["T.int64(0)"], names)
            dtype = otypes[0][1]
            step += elementwise(otypes[0][0], lambda its: [
                f"{_element(dst_loc, dst_row, its, names)} = T.if_then_else({bad} != T.int64(0), "
                f"T.Cast(\"{dtype}\", 0), {_element(src_loc, src_row, its, names)})"], names)
            continue
        text = []
        for first in (False, True):
            items = [arg_of(a, first) for a in args] + [arg_of(("call", c, j)) for j in range(len(otypes))]
            items += [_expr(x, names) for x in scalars]
            text.append(f"T.evaluate(T.call_cpacked(\"{_alias(region, kernel)}\", {', '.join(items)}))")
        if text[0] == text[1]:
            step.append(text[0])
        else:                                         # reads a state kept in its stacked rows
            step += ["if t == T.int64(0):", "    " + text[1], "else:", "    " + text[0]]
    for name, key, shape in copy_out:
        loc, row = written(key)
        step += copy_lines(name, "t", loc, row, shape, names)
    if ahead:                   # on the device: a step counts, and sets the condition, while the condition held
        loc, row = written(cond_key)
        bads = [_element(*written(v[1:]), ["T.int64(0)"], names) for v in checks]
        step += elementwise([], lambda _: ["if ctl[1] != T.int64(0):", "    ctl[0] = t + T.int64(1)"]
                            + [f"    ctl[2] = ctl[2] + {b}" for b in bads]
                            + [f"    ctl[1] = T.Cast(\"int64\", {_element(loc, row, [], names)})"], names)
    elif is_while:
        loc, row = written(cond_key)
        step += [f"ctl[1] = T.Cast(\"int64\", {_element(loc, row, [], names)})", "ctl[0] = t + T.int64(1)"]

    # ---- the function text: initial states into their row 1, the steps, the final states out of their rows
    body = []
    for s in loc_state:
        shape = ptypes[state_param[s]][0]
        body += copy_lines(loc_state[s], loc_state[s].before("T.int64(0)") if ahead else "T.int64(1)",
                           f"p{state_param[s]}", None, shape, names)
    if ahead:
        # the caller checked the condition for the first iteration; the n steps all run, those after the
        # condition failed with their results ignored: (count, condition) is kept on the device
        body += elementwise([], lambda _: ["ctl[0] = T.int64(0)", "ctl[1] = T.int64(1)", "ctl[2] = T.int64(0)"], names)
        body.append("for t in range(n):")
        count = "ctl[0]"
    elif is_while:
        # the caller checked the condition for the first iteration; each step stores (t + 1, its condition)
        body += ["ctl[0] = T.int64(0)", "ctl[1] = T.int64(1)", "while ctl[0] < n and ctl[1] != T.int64(0):",
                 "    t: T.int64 = ctl[0]"]
        count = "ctl[0]"
    else:
        body.append("for t in range(n):")
        count = "n"
    body += ["    " + ln for ln in step]
    for s in range(n_states):
        shape = ptypes[state_param[s]][0]
        if device is not None:          # count may be on the device: read where the copy runs
            if s in in_rows:
                body += select_copy_lines(f"f{s}", count, f"p{state_param[s]}", None, in_rows[s],
                                          f"({count} - T.int64(1))", shape, names)
            else:
                body += copy_lines(f"f{s}", None, loc_state[s], loc_state[s].before(count), shape, names)
        elif s in in_rows:
            body.append(f"if {count} == T.int64(0):")
            body += ["    " + ln for ln in copy_lines(f"f{s}", None, f"p{state_param[s]}", None, shape, names)]
            body.append("else:")
            body += ["    " + ln for ln in copy_lines(f"f{s}", None, in_rows[s], f"({count} - T.int64(1))", shape,
                                                        names)]
        else:
            body += copy_lines(f"f{s}", None, loc_state[s], f"({count} + T.int64(1))", shape, names)
    for nm, shape, dtype in scratch:
        lines_params.append(f"h_{nm}: T.handle")
        dims = ", ".join(_expr(d, names) for d in shape)
        lines_match.append(f"{nm} = T.match_buffer(h_{nm}, ({dims},), \"{dtype}\")" if shape else
                           f"{nm} = T.match_buffer(h_{nm}, (), \"{dtype}\")")
        out_types.append((shape, dtype))
    decls = [f"{nm} = T.int64()" for nm in [f"d{k}" for k in range(len(names.vars))] + ([] if is_while else ["n"])]
    text = ["# from tvm.script import tirx as T", "@T.prim_func", f"def {_prim_name(region, device)}("
            + ", ".join(lines_params) + "):"]
    # noalias (every buffer is its own tensor): a function without it in the LLVM module was seen to make LLVM
    # keep matmul accumulators in memory (see cpu_schedule.build_cpu). A device loop is marked: scheduled
    # already (its copies are written as kernels) and no launch guard around the whole function (launch_guard)
    attrs = '{"tirx.noalias": True}' if device is None else \
        '{"tirx.noalias": True, "tirx.is_scheduled": True, "dyntvm.compiled_loop": True}'
    text += ["    " + ln for ln in [f'T.func_attr({attrs})'] + decls + lines_match + body]
    return "\n".join(text) + "\n", consts, out_types, calls, steps_var


def _parse(src: str):
    from tvm.script import tirx as T   # noqa: F401 - the script's namespace
    return tvm.script.from_source(src)


def add_loop(mod: tvm.IRModule, region: str, roles: tuple, outs: tuple, n_ys: int, kind: str = "foreach",
             device: str | None = None) -> tvm.IRModule:
    src, consts, out_types, calls, steps_var = build_loop(mod, region, roles, outs, n_ys, kind, device)
    try:
        prim = _parse(src)
    except Exception as e:  # noqa: BLE001 - the generated text did not parse: decline, with the reason
        raise Decline(f"the loop function did not parse: {type(e).__name__}: {str(e)[:300]}") from e
    func = mod[region]
    bb = relax.BlockBuilder(mod)
    # each kernel the loop calls gets a copy under a name of this loop: `call_cpacked` calls a C symbol,
    # and a plain kernel name ("add") may resolve to another library's function of that name
    # The region's own function calls the copies too, and an original no other function calls is dropped:
    # LLVM then compiles each kernel once (the copies had added about a second to the decode model's build).
    redirect = {}
    for kernel in sorted({c[0] for c in calls} - {SANITIZE}):
        if _alias(region, kernel) == kernel:        # copied already for the region's other loop function
            continue
        gv_k = mod.get_global_var(kernel)
        redirect[gv_k] = bb.add_func(mod[gv_k].with_attr("global_symbol", _alias(region, kernel)),
                                     _alias(region, kernel))
    gv_region = mod.get_global_var(region)
    bb.update_func(gv_region, _redirect_calls(func, redirect))
    gv = bb.add_func(prim, _prim_name(region, device))
    n = tvm.tirx.Var("n_steps", "int64")

    steps = tvm.sym.Analyzer()
    steps.bind(steps_var, n)

    def shape_of(shape):            # the body's dims as they are; "n" (the steps) becomes n_steps
        return [n if isinstance(d, str) else steps.simplify(d) if _uses(d, steps_var) else d for d in shape]
    params = []
    for p, (role, _) in zip(func.params, roles):
        shape, dtype = _tensor_type(p.ty)
        shape = ([n] if role == "data" else []) + shape
        params.append(relax.Var(p.name, relax.TensorType(shape, dtype)))
    tensors = list(params)
    if kind == "while":                               # the capacity: a shape (cap,)
        params.append(relax.Var("cap", relax.ShapeType([n])))
    out_ty = [relax.TensorType(shape_of(s), d) for s, d in out_types]
    name = compiled_loop_name(region, device is not None)
    with bb.function(name, params):
        # a while_loop's capacity n: a scalar argument after the tensors
        args = relax.Tuple(tensors + list(consts) + ([relax.prim_value(n)] if kind == "while" else []))
        call = relax.call_tir(gv, args, out_ty[0] if len(out_ty) == 1 else out_ty)
        if len(out_ty) == 1:                          # always a tuple for the executor
            res = bb.emit(relax.Tuple([bb.emit(call)]))
        else:
            res = bb.emit(call)
        bb.emit_func_output(res)
    return _drop_unused(bb.get(), {gv.name_hint for gv in redirect})


def _uses(d, var) -> bool:
    return not isinstance(d, (int, str)) and any(v.same_as(var) for v in tvm.tirx.analysis.undefined_vars(d))


def _redirect_calls(func: relax.Function, redirect: dict) -> relax.Function:
    """`func` with its ``call_tir`` calls of the kernels in `redirect` (GlobalVar -> GlobalVar) redirected."""
    call_tir = tvm.ir.Op.get("relax.call_tir")

    @relax.expr_functor.mutator
    class Redirect(relax.PyExprMutator):
        def visit_call_(self, call):
            call = super().visit_call_(call)
            if call.op.same_as(call_tir) and call.args[0] in redirect:
                return relax.Call(call.op, [redirect[call.args[0]]] + list(call.args[1:]), call.attrs,
                                  call.ty_args if hasattr(call, "ty_args") else call.sinfo_args)
            return call
    return Redirect().visit_expr(func)


def _drop_unused(mod: tvm.IRModule, candidates: set) -> tvm.IRModule:
    """`mod` without those of the kernels named in `candidates` that no function calls any more (their copies
    replaced them; loop kernels call only the copies)."""
    used = set()
    for _, f in mod.functions_items():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, lambda e: used.add(e.name_hint) if isinstance(e, tvm.ir.GlobalVar)
                                            else None)
    out = tvm.IRModule({gv: f for gv, f in mod.functions_items()
                        if gv.name_hint not in candidates or gv.name_hint in used}, attrs=mod.attrs)
    return out


def loop_pass(specs: list):
    """Module pass adding a compiled loop per spec ``(kind, region, roles, outs, n_ys, device)`` (`device`: see
    `build_loop`); a declined one is left out (`declined` lists why, for tests and debugging)."""
    @tvm.transform.module_pass(opt_level=0, name="dyntvm.CompiledLoops")
    def add_compiled_loops(mod: tvm.IRModule, ctx) -> tvm.IRModule:
        for kind, region, roles, outs, n_ys, device in specs:
            try:
                mod = add_loop(mod, region, roles, outs, n_ys, kind, device)
                stats.compiled.append(region)
            except Decline as e:
                stats.declined.append((region, str(e)))
            except Exception as e:  # noqa: BLE001 - an IR this generator did not foresee: the loop runs step by step
                stats.declined.append((region, f"unexpected {type(e).__name__}: {str(e)[:200]}"))
        return mod
    return add_compiled_loops


class _Stats:
    def __init__(self):
        self.compiled: list = []
        self.declined: list = []


stats = _Stats()


def loop_specs(graph, device: str | None = None) -> list:
    """``(kind, region, roles, outs, n_ys, device)`` for every foreach and while_loop of `graph` (nested ones
    too) that `ir.compiled_loop.foreach_loop_plan` / `while_loop_plan` accepts."""
    from ..ir.compiled_loop import foreach_loop_plan, while_loop_plan
    out = []

    def walk(g):
        for node in g.nodes:
            if node.op == "foreach":
                plan = foreach_loop_plan(node)
                if plan is not None:
                    region, roles, outs = plan
                    out.append(("foreach", region.attrs.name, roles, outs,
                                len(node.subgraphs[0].outputs) - node.attrs.num_states, device))
            elif node.op == "while_loop":
                plan = while_loop_plan(node)
                if plan is not None:
                    region, roles, outs = plan
                    out.append(("while", region.attrs.name, roles, outs,
                                len(node.subgraphs[1].outputs) - node.attrs.num_vars - 1, device))
            for sub in node.subgraphs:
                walk(sub)
    walk(graph)
    return out
