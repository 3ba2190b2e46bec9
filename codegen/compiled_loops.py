"""Compiled `foreach` loops: one TIR function runs every step, calling the body's kernels directly.

For each loop `ir.compiled_loop.foreach_loop_plan` accepts, the module pass `add_compiled_loops` reads the
body region's Relax function after fusion and scheduling — a sequence of ``call_tir`` kernel calls — and
adds two functions:

* a PrimFunc ``<region>__loop_kernel`` with a serial loop over the steps whose body calls each kernel with
  ``T.call_cpacked`` (a direct C call of the kernel's packed entry, no lookup), passing DLTensors built on
  the stack: data rows are addresses inside the sequence (``&xs[t, 0, ...]``), per-step outputs are written
  straight into their row of the stacked output, intermediates live in buffers allocated once per call, and
  each new state is either the stacked-output row it was written to (read back at the next step) or one of
  two buffers used alternately, so no step copies a state;
* a public Relax function ``<region>__loop`` (the name the executor looks up) that calls it with
  ``call_tir``, allocating the stacked outputs ``[T, ...]`` and the final states.

A step then costs its kernels and about a hundred nanoseconds of argument setup, against a region call from
Python and the executor's bookkeeping (the LSTM's B=1 step: 6.2 us in the loop, 9.1 us as a region call
from Python plus 1.5-2 us of executor).

Kernels assume 64-byte aligned data, so a loop is only compiled when every row it addresses (data and
stacked outputs) is a provable multiple of 64 bytes; shapes must be products/sums of the body's dims. Any
other pattern (a Relax op that is not a kernel call, a state that changes shape, a value returned twice)
declines the loop: the executor then runs it step by step.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..ir.compiled_loop import compiled_loop_name

ALIGN = 64


class Decline(Exception):
    """This loop is not compiled (the message says why; the step-by-step loop runs instead)."""


class _Names:
    """TVMScript names for the symbolic dims of the body (by object identity)."""

    def __init__(self):
        self.vars: list = []

    def of(self, v) -> str:
        for k, w in enumerate(self.vars):
            if w.same_as(v):
                return f"d{k}"
        self.vars.append(v)
        return f"d{len(self.vars) - 1}"


_BIN = {"Add": "+", "Sub": "-", "Mul": "*", "FloorDiv": "//", "FloorMod": "%"}


def _expr(e, names: _Names) -> str:
    kind = type(e).__name__
    if kind == "IntImm":
        return f"T.int64({int(e.value)})"
    if kind == "Var":
        return names.of(e)
    if kind in _BIN:
        return f"({_expr(e.a, names)} {_BIN[kind]} {_expr(e.b, names)})"
    if kind in ("Min", "Max"):
        return f"T.{kind.lower()}({_expr(e.a, names)}, {_expr(e.b, names)})"
    raise Decline(f"shape expression {e} ({kind})")


def _tensor_type(ty):
    if not isinstance(ty, relax.TensorType) or ty.shape is None or not hasattr(ty.shape, "values"):
        raise Decline(f"not a tensor of known rank: {ty}")
    return list(ty.shape.values), str(ty.dtype)


def _dtype_hint(dtype: str) -> str:
    return "T.bool(False)" if dtype == "bool" else f"T.{dtype}(0)"


def _is_aligned(shape, dtype: str) -> bool:
    size = np.dtype(dtype).itemsize
    expr = tvm.tirx.const(size, "int64")
    for d in shape:
        expr = expr * d
    ana = tvm.sym.Analyzer()
    return bool(ana.can_prove(tvm.tirx.floormod(expr, ALIGN) == 0))


class _Loc:
    """Where a tensor value of the body lives at step t, as a TVMScript address: `buf[idx...]` with `t`
    (or `t - 1`) standing for the step."""

    def __init__(self, buf: str, shape: list, dtype: str, row: bool):
        self.buf, self.shape, self.dtype, self.row = buf, shape, dtype, row

    def addr(self, step: str) -> str:
        zeros = ["T.int64(0)"] * len(self.shape)
        idx = ([step] if self.row else []) + zeros
        return f"T.address_of({self.buf}[{', '.join(idx)}])" if idx else f"T.address_of({self.buf}[()])"

    def arg(self, step: str, names: _Names) -> str:
        dims = ", ".join(_expr(d, names) for d in self.shape)
        shape = f"T.tvm_stack_make_shape({dims})" if dims else "T.reinterpret(\"handle\", T.uint64(0))"
        return (f"T.tvm_stack_make_array({self.addr(step)}, {shape}, "
                f"T.reinterpret(\"handle\", T.uint64(0)), {len(self.shape)}, {_dtype_hint(self.dtype)}, "
                "T.int64(0))")


def _alias(region: str, kernel: str) -> str:
    return f"{region}__loop__{kernel}"


def build_loop(mod: tvm.IRModule, region: str, roles: tuple, outs: tuple, n_ys: int):
    """(TVMScript text of the loop PrimFunc, the Relax constants it takes, its output types, the kernel calls)
    for one loop, or raises Decline."""
    func = mod[region]
    if not isinstance(func, relax.Function):
        raise Decline("the body is not a Relax function")
    names = _Names()
    n_states = len(outs) - n_ys
    params = list(func.params)
    ptypes = [_tensor_type(p.ty) for p in params]
    if any(not shape for shape, _ in ptypes):
        raise Decline("a 0-d tensor in the body (scalar states are not compiled)")
    seq = func.body
    if len(seq.blocks) != 1:
        raise Decline("more than one binding block")
    bindings = list(seq.blocks[0].bindings)

    # ---- the body: kernel calls, tuple projections, the output tuple
    value_of = {}                                     # relax var -> ("param", i) | ("call", k, j) | ("tuple", [...])
    calls = []                                        # (kernel name, [arg exprs], [out types], tir scalar args)
    for i, p in enumerate(params):
        value_of[p] = ("param", i)
    consts = []                                       # relax constants passed to kernels

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
    for b in bindings:
        if not isinstance(b, relax.VarBinding):
            raise Decline("a match_cast binding")
        v = b.value
        if isinstance(v, relax.Call) and v.op.same_as(call_tir):
            gv = v.args[0]
            args = [resolve(x) for x in v.args[1].fields]
            scalars = list(v.args[2].values) if len(v.args) > 2 else []
            out_ty = v.ty
            out_types = [_tensor_type(t) for t in out_ty.fields] if isinstance(out_ty, tvm.ir.TupleType) \
                else [_tensor_type(out_ty)]
            if any(not shape for shape, _ in out_types):
                raise Decline("a kernel with a 0-d output")
            calls.append((gv.name_hint, args, out_types, scalars))
            k = len(calls) - 1
            value_of[b.var] = ("call", k, None if isinstance(out_ty, tvm.ir.TupleType) else 0)
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
    for o in region_outs:
        if o[2] is None:
            raise Decline("a whole multi-output kernel returned")

    # ---- locations: per kernel output, where it is written
    ys_of, state_of = {}, {}
    for k in range(n_ys):
        key = tuple(region_outs[outs[k]][1:])
        if key in ys_of.values():
            raise Decline("a value stacked twice")
        ys_of[k] = key
    for s in range(n_states):
        key = tuple(region_outs[outs[n_ys + s]][1:])
        if key in state_of.values():
            raise Decline("one value as two states")
        state_of[s] = key
    state_param = {}
    for i, (role, k) in enumerate(roles):
        if role == "state":
            state_param[k] = i

    # ---- the PrimFunc's parameters
    lines_params, lines_match = [], []
    loc_param = {}
    for i, ((role, _), (shape, dtype)) in enumerate(zip(roles, ptypes)):
        full = (["n"] if role == "data" else []) + [_expr(d, names) for d in shape]
        lines_params.append(f"h_p{i}: T.handle")
        lines_match.append(f"p{i} = T.match_buffer(h_p{i}, ({', '.join(full)},), \"{dtype}\")"
                           if full else f"p{i} = T.match_buffer(h_p{i}, (), \"{dtype}\")")
        if role == "data" and not _is_aligned(shape, dtype):
            raise Decline(f"data rows of {shape} {dtype} are not 64-byte multiples")
        loc_param[i] = _Loc(f"p{i}", shape, dtype, row=(role == "data"))
    const_types = [_tensor_type(c.ty) for c in consts]
    for k, (shape, dtype) in enumerate(const_types):
        lines_params.append(f"h_k{k}: T.handle")
        dims = ", ".join(_expr(d, names) for d in shape)
        lines_match.append(f"k{k} = T.match_buffer(h_k{k}, ({dims},), \"{dtype}\")" if shape else
                           f"k{k} = T.match_buffer(h_k{k}, (), \"{dtype}\")")
    out_types = []
    loc_out = {}                                      # (call, j) -> _Loc of its row in a stacked output
    for k in range(n_ys):
        c, j = ys_of[k]
        shape, dtype = calls[c][2][j]
        if not _is_aligned(shape, dtype):
            raise Decline(f"per-step outputs of {shape} {dtype} are not 64-byte multiples")
        lines_params.append(f"h_y{k}: T.handle")
        dims = ", ".join(["n"] + [_expr(d, names) for d in shape])
        lines_match.append(f"y{k} = T.match_buffer(h_y{k}, ({dims},), \"{dtype}\")")
        loc_out[(c, j)] = _Loc(f"y{k}", shape, dtype, row=True)
        out_types.append((["n"] + shape, dtype))
    for s in range(n_states):
        i = state_param[s]
        shape, dtype = ptypes[i]
        c, j = state_of[s]
        nshape, ndtype = calls[c][2][j]
        ana = tvm.sym.Analyzer()
        if ndtype != dtype or len(nshape) != len(shape) or not all(
                ana.can_prove_equal(a, b) for a, b in zip(nshape, shape)):
            raise Decline("a state whose new value has another shape or dtype")
        lines_params.append(f"h_f{s}: T.handle")
        dims = ", ".join(_expr(d, names) for d in shape)
        lines_match.append(f"f{s} = T.match_buffer(h_f{s}, ({dims},), \"{dtype}\")" if shape else
                           f"f{s} = T.match_buffer(h_f{s}, (), \"{dtype}\")")
        out_types.append((shape, dtype))

    # ---- buffers allocated once: intermediates and the two alternating buffers of each non-stacked state
    # (buffers the VM allocates as extra outputs of the call: TIR allocations inside the loop function were
    # seen to crash the kernels at small sizes)
    scratch = []
    loc_tmp, loc_state = {}, {}                       # (call, j) -> _Loc; state s -> (_Loc A, _Loc B)
    for c, (_, _, otypes, _) in enumerate(calls):
        for j, (shape, dtype) in enumerate(otypes):
            key = (c, j)
            if key in loc_out:
                continue
            states_here = [s for s, v in state_of.items() if v == key]
            if states_here:
                s = states_here[0]
                for half in "ab":
                    scratch.append((f"s{s}{half}", shape, dtype))
                loc_state[s] = tuple(_Loc(f"s{s}{half}", shape, dtype, row=False) for half in "ab")
            else:
                scratch.append((f"t{c}_{j}", shape, dtype))
                loc_tmp[key] = _Loc(f"t{c}_{j}", shape, dtype, row=False)

    def where(value, t, phase):
        """Address of a body value at step `t` (a TVMScript expression); phase: 0 (t == 0), 1 (t odd), 2 (t
        even, >= 2)."""
        if value[0] == "scalar":
            return None, _expr(value[1], names)
        if value[0] == "const":
            shape, dtype = const_types[value[1]]
            return _Loc(f"k{value[1]}", shape, dtype, row=False), t
        if value[0] == "param":
            i = value[1]
            role, k = roles[i]
            if role != "state" or phase == 0:         # a data row, a capture, the initial state
                return loc_param[i], t
            return produced_at(state_of[k], True, phase, t)
        return produced_at((value[1], value[2]), False, phase, t)

    def produced_at(key, prev, phase, t):
        """A kernel output: written at step t (`prev` False), or read from the previous step."""
        if key in loc_out:
            return loc_out[key], (f"({t} - T.int64(1))" if prev else t)
        if key in loc_tmp:
            return loc_tmp[key], t
        s = next(s for s, v in state_of.items() if v == key)
        a, b = loc_state[s]
        # step t writes a if t is even, b if odd; the previous step wrote the other one
        writes, reads = (a, b) if phase in (0, 2) else (b, a)
        return (reads if prev else writes), t

    def step_calls(phase, t):
        out = []
        for c, (kernel, args, otypes, scalars) in enumerate(calls):
            items = []
            for a in args:
                loc, st = where(a, t, phase)
                items.append(st if loc is None else loc.arg(st, names))
            for j in range(len(otypes)):
                loc, st = produced_at((c, j), False, phase, t)
                items.append(loc.arg(st, names))
            items += [_expr(x, names) for x in scalars]
            out.append(f"T.evaluate(T.call_cpacked(\"{_alias(region, kernel)}\", {', '.join(items)}))")
        return out

    def copy_state(s, src: _Loc, step):
        shape, _ = ptypes[state_param[s]]
        its = [f"i{k}" for k in range(len(shape))]
        rng = ", ".join(_expr(d, names) for d in shape)
        idx = ([step] if src.row else []) + its
        return [f"for {', '.join(its)} in T.grid({rng}):",
                f"    f{s}[{', '.join(its)}] = {src.buf}[{', '.join(idx)}]"]

    # ---- the function text: step 0 peeled (it reads the initial states), then odd / even steps
    body = ["if n > T.int64(0):"]
    body += ["    " + ln for ln in step_calls(0, "T.int64(0)")]
    body.append("for t in range(T.int64(1), n):")
    body.append("    if t % T.int64(2) == T.int64(1):")
    body += ["        " + ln for ln in step_calls(1, "t")]
    body.append("    else:")
    body += ["        " + ln for ln in step_calls(2, "t")]
    for s in range(n_states):
        i = state_param[s]
        body.append("if n == T.int64(0):")
        body += ["    " + ln for ln in copy_state(s, loc_param[i], None)]
        key = state_of[s]
        if key in loc_out:
            body.append("else:")
            body += ["    " + ln for ln in copy_state(s, loc_out[key], "n - T.int64(1)")]
        else:
            a, b = loc_state[s]
            body.append("elif (n - T.int64(1)) % T.int64(2) == T.int64(0):")
            body += ["    " + ln for ln in copy_state(s, a, None)]
            body.append("else:")
            body += ["    " + ln for ln in copy_state(s, b, None)]
    for nm, shape, dtype in scratch:
        lines_params.append(f"h_{nm}: T.handle")
        dims = ", ".join(_expr(d, names) for d in shape)
        lines_match.append(f"{nm} = T.match_buffer(h_{nm}, ({dims},), \"{dtype}\")")
        out_types.append((shape, dtype))
    decls = [f"{nm} = T.int64()" for nm in [f"d{k}" for k in range(len(names.vars))] + ["n"]]
    text = ["# from tvm.script import tirx as T", "@T.prim_func", f"def {region}__loop_kernel("
            + ", ".join(lines_params) + "):"]
    # noalias (every buffer is its own tensor): a function without it in the LLVM module was seen to make LLVM
    # keep matmul accumulators in memory (see cpu_schedule.build_cpu)
    text += ["    " + ln for ln in ['T.func_attr({"tirx.noalias": True})'] + decls + lines_match + body]
    return "\n".join(text) + "\n", consts, out_types, calls


def _parse(src: str):
    from tvm.script import tirx as T   # noqa: F401 - the script's namespace
    return tvm.script.from_source(src)


def add_loop(mod: tvm.IRModule, region: str, roles: tuple, outs: tuple, n_ys: int) -> tvm.IRModule:
    src, consts, out_types, calls = build_loop(mod, region, roles, outs, n_ys)
    try:
        prim = _parse(src)
    except Exception as e:  # noqa: BLE001 - the generated text did not parse: decline, with the reason
        raise Decline(f"the loop function did not parse: {type(e).__name__}: {str(e)[:300]}") from e
    func = mod[region]
    bb = relax.BlockBuilder(mod)
    # each kernel the loop calls gets a copy under a name of this loop: `call_cpacked` calls a C symbol,
    # and a plain kernel name ("add") may resolve to another library's function of that name
    for kernel in sorted({c[0] for c in calls}):
        gv_k = mod.get_global_var(kernel)
        bb.add_func(mod[gv_k].with_attr("global_symbol", _alias(region, kernel)), _alias(region, kernel))
    gv = bb.add_func(prim, f"{region}__loop_kernel")
    n = tvm.tirx.Var("n_steps", "int64")

    def shape_of(shape):            # the body's dims as they are; "n" (the steps) becomes n_steps
        return [n if isinstance(d, str) else d for d in shape]
    params = []
    for p, (role, _) in zip(func.params, roles):
        shape, dtype = _tensor_type(p.ty)
        shape = ([n] if role == "data" else []) + shape
        params.append(relax.Var(p.name, relax.TensorType(shape, dtype)))
    out_ty = [relax.TensorType(shape_of(s), d) for s, d in out_types]
    name = compiled_loop_name(region)
    with bb.function(name, params):
        if len(out_ty) == 1:                          # always a tuple for the executor
            res = bb.emit(relax.Tuple([bb.emit(relax.call_tir(gv, relax.Tuple(params + list(consts)), out_ty[0]))]))
        else:
            res = bb.emit(relax.call_tir(gv, relax.Tuple(params + list(consts)), out_ty))
        bb.emit_func_output(res)
    return bb.get()


def loop_pass(specs: list):
    """Module pass adding a compiled loop per spec ``(region, roles, outs, n_ys)``; a declined one is left
    out (`declined` lists why, for tests and debugging)."""
    @tvm.transform.module_pass(opt_level=0, name="dyntvm.CompiledLoops")
    def add_compiled_loops(mod: tvm.IRModule, ctx) -> tvm.IRModule:
        for region, roles, outs, n_ys in specs:
            try:
                mod = add_loop(mod, region, roles, outs, n_ys)
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


def loop_specs(graph) -> list:
    """``(region, roles, outs, n_ys)`` for every foreach of `graph` (nested ones too) that
    `ir.compiled_loop.foreach_loop_plan` accepts."""
    from ..ir.compiled_loop import foreach_loop_plan
    out = []

    def walk(g):
        for node in g.nodes:
            plan = foreach_loop_plan(node) if node.op == "foreach" else None
            if plan is not None:
                region, roles, outs = plan
                out.append((region.attrs.name, roles, outs, len(node.subgraphs[0].outputs) - node.attrs.num_states))
            for sub in node.subgraphs:
                walk(sub)
    walk(graph)
    return out
