"""Lowering of static regions to Relax: one public Relax function per region Graph.

API
---
``build_region_function(bb, graph, name) -> relax.GlobalVar``
    Adds one public function ``name`` (``global_symbol`` = name) to the BlockBuilder's module.
    Must be called outside any function scope of `bb`. The function takes ``graph.inputs`` in
    order (one Relax tensor param each) and returns a ``relax.Tuple`` of ``graph.outputs``
    (always a tuple, also for one output). Symbolic dims: every distinct symbol (``"N"``, and
    unknown ``"_u3"``) of the input shapes becomes one fresh ``tirx.Var(name, "int64")`` for
    this function only (TVM rejects a var shared by two functions); an expression input dim
    (``"(T + 1)"``) becomes a fresh var too (symbols only reachable through such a dim are
    solved for when possible, e.g. ``T = d - 1``). Dims of intermediate values come from Relax's
    inference. Dims in attrs (reshape targets, full shapes...) are translated over the
    function's vars; an unbound symbol raises `CompileError`.
``unsupported_ops(graph) -> list[str]``
    Sorted op names (whole tree) that have no converter.
``build_module(regions: list[tuple[str, Graph]]) -> tvm.IRModule``
    All region functions in one IRModule, checked with ``relax.analysis.well_formed``.

Calling convention of the compiled function: ``vm[name](*tensors)`` returns a tvm Array with
one tensor per graph output, in order.
"""
from __future__ import annotations

import re

import tvm
from tvm import relax

from dyntvm.errors import CompileError, UnsupportedOpError
from ..ir.graph import Graph
from .converters import CONVERTERS, convert_node
from .converters.window_dims import hoist_window_sizes
from .dims import ConvertContext

__all__ = ["build_region_function", "build_module", "unsupported_ops", "param_name"]

_BAD = re.compile(r"[^A-Za-z0-9_]")


def param_name(value, i: int) -> str:
    """Relax parameter name of graph input `i` (the Value's name, sanitised)."""
    n = _BAD.sub("_", value.name or "") or f"in{i}"
    return n if not n[0].isdigit() else f"in_{n}"


def unsupported_ops(graph: Graph) -> list[str]:
    """Ops of `graph` (subgraphs included) that have no Relax converter, sorted."""
    return sorted({n.op for n in graph.walk() if n.op not in CONVERTERS})


def _check_region(graph: Graph, name: str):
    missing = unsupported_ops(graph)
    if missing:
        raise UnsupportedOpError(f"region {name!r} contains ops without a Relax converter: "
                                 f"{', '.join(missing)} (only static ops can be compiled)")
    for n in graph.nodes:
        if n.subgraphs:
            raise CompileError(f"region {name!r}: node {n.name!r} ({n.op}) has subgraphs; a region "
                               "must be flat")


def build_region_function(bb: relax.BlockBuilder, graph: Graph, name: str,
                          device_checks: bool = False, taken: set | None = None) -> relax.GlobalVar:
    """Lower the closed static region `graph` to one public Relax function `name` in `bb`'s
    module and return its GlobalVar (see module doc for the conventions). `taken`: the names of the functions
    already built into `bb` (updated); without it the module is searched (slow for thousands of regions)."""
    _check_region(graph, name)
    if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
        raise CompileError(f"region function name {name!r} is not an identifier")
    if name in taken if taken is not None else any(gv.name_hint == name for gv in bb.get().get_global_vars()):
        raise CompileError(f"a function named {name!r} is already in the module")
    if taken is not None:
        taken.add(name)
    ctx = ConvertContext(name, device_checks)
    params = []
    env = {}
    taken = set()
    for i, v in enumerate(graph.inputs):
        shape = [ctx.bind_input_dim(d, f"{param_name(v, i)}_d{j}") for j, d in enumerate(v.type.shape)]
        pn = param_name(v, i)
        while pn in taken:
            pn += "_"
        taken.add(pn)
        p = relax.Var(pn, relax.TensorType(shape, v.type.dtype))
        params.append(p)
        env[v] = p
    ctx.solve()
    ctx.head_vars = {d for p in params for d in p.ty.shape.values if isinstance(d, tvm.tirx.Var)}
    with bb.function(name, params):
        with bb.dataflow():
            for node in graph.nodes:
                try:
                    args = [env[v] for v in node.inputs]
                except KeyError:
                    raise CompileError(f"region {name!r} is not closed: node {node.name!r} ({node.op}) "
                                       "uses a value that is neither a region input nor computed "
                                       "earlier") from None
                outs = convert_node(bb, node, args, ctx)
                for v, e in zip(node.outputs, outs):
                    env[v] = e
            try:
                results = [env[v] for v in graph.outputs]
            except KeyError:
                raise CompileError(f"region {name!r}: an output is not computed by the region") from None
            out = bb.emit_output(relax.Tuple(results))
        gv = bb.emit_func_output(out)
    if gv.name_hint != name:     # a PrimFunc emitted meanwhile took the name (converters use "dt_*")
        raise CompileError(f"region function {name!r} clashes with a kernel name in the module "
                           f"(got {gv.name_hint!r}); names starting with 'dt_' are reserved")
    if ctx.window_sizes:
        bb.update_func(gv, hoist_window_sizes(bb.get()[gv], ctx))
    if ctx.flat_views:
        _drop_dead_views(bb, gv, ctx)
    try:
        relax.analysis.well_formed(bb.get()[gv])
    except Exception as e:  # noqa: BLE001 - TVM raises its own error types
        raise CompileError(f"region function {name!r} is not well formed: {e}") from e
    return gv


def _drop_dead_views(bb: relax.BlockBuilder, gv, ctx: ConvertContext) -> None:
    """Removes the reshapes of flattened matmul results (`ctx.flat_views`, with their casts) that no op reads
    any more (their elementwise consumers ran on the 2-D result: `converters.sink_flat`): FuseOps does not
    fuse a matmul whose result something else reads, a dead binding too (FuseTIR made it a kernel output).
    Only those: any other unused binding (a run-time check's match_cast) stays."""
    func = bb.get()[gv]
    cands = {v[0] for v in ctx.flat_views} | set(ctx.flat_casts)
    blocks = [list(blk.bindings) for blk in func.body.blocks]
    changed = True
    dropped = False
    while changed:
        used = set(relax.analysis.free_vars(func.body.body))
        for bindings in blocks:
            for b in bindings:
                used.update(relax.analysis.free_vars(b.value))
        changed = False
        for bindings in blocks:
            keep = [b for b in bindings if b.var in used or b.var not in cands]
            if len(keep) != len(bindings):
                bindings[:] = keep
                changed = dropped = True
    if not dropped:
        return
    new_blocks = [relax.DataflowBlock(bs) if isinstance(blk, relax.DataflowBlock) else relax.BindingBlock(bs)
                  for blk, bs in zip(func.body.blocks, blocks)]
    body = relax.SeqExpr(new_blocks, func.body.body)
    new = relax.Function(func.params, body, func.body.ty, func.is_pure, func.attrs)
    bb.update_func(gv, relax.transform.Normalize()(tvm.IRModule({gv: new}))[gv])


def build_module(regions: list, device_checks: bool = False) -> tvm.IRModule:
    """One IRModule holding a public Relax function per ``(name, graph)`` region. `device_checks`: run-time
    checks that work inside GPU kernels (see `te_kernels.te_check_device`)."""
    bb = relax.BlockBuilder()
    taken: set = set()
    for name, graph in regions:
        build_region_function(bb, graph, name, device_checks, taken)
    mod = bb.get()
    try:
        relax.analysis.well_formed(mod)
    except Exception as e:  # noqa: BLE001 - TVM raises its own error types
        raise CompileError(f"the region module is not well formed: {e}") from e
    return mod
