"""Which partitioned graphs run as one Relax VM program (codegen builds it, the runtime calls it).

A *VM program* is one public Relax function, `PROGRAM`, in a model's kernel library that runs the whole
partitioned graph: one call from Python is one VM call, and no Python runs between the kernels
(`codegen/vm_program.py` builds it, `runtime/vm_program.py` calls it). Node by node:

* a region: a call of its Relax function (first, where its sizes could exceed the machine's memory, those sizes
  evaluated in the program, and a call of `GUARD_CALLBACK`, the runtime's size check `runtime/region_sizes.py`,
  where one may exceed 256 MiB: `codegen/vm_guard.py`);
* `cond` / `case` (not exclusive): a Relax ``If`` (a case: nested ``If`` s, its predicates computed lazily in
  order, as the executor does);
* a `foreach`: a call of its compiled loop (`ir.compiled_loop`) where codegen built one, else a Relax
  function over a range of steps that halves the range (`codegen/vm_program.py`); a `while_loop` whose body is
  a compiled loop: calls of the loop function of growing capacity, a recursion one level per call;
* the common forms of dynamic-shape ops (`native`: boolean_mask on axis 0, 1-d nonzero, topk with a tensor k,
  slice_dyn)
  and the static ops left outside regions: kernels (`codegen/vm_dynamic.py`);
* another dynamic-shape op: a call of the packed function `KERNEL_CALLBACK` with the node's key (`node_keys`),
  which runs the op's numpy kernel (registered from Python by the runtime: one Python callback per dynamic
  node, no executor around it).

Anything else — a `while_loop` that is not a compiled loop, a foreach with `valid_length`, lists, nodes with
run-time dim checks, ops with symbolic attrs (but static ones whose inputs' dims bind them), an exclusive
`case` — is listed by `unsupported_nodes`, and the whole model then runs in the Python executor (as before).
"""
from __future__ import annotations

import re

import numpy as np

from .compiled_loop import while_loop_plan
from .graph import Graph, Node
from .list_type import ListType
from .ops import OpKind, attr_symbols
from .region_counts import amplified_counts

PROGRAM = "dyntvm_main"
KERNEL_CALLBACK = "dyntvm.vm_kernel"
GUARD_CALLBACK = "dyntvm.vm_size_guard"
#: a region's byte counts up to this size are checked inside the program (`codegen/vm_guard.py`), larger ones by
#: the runtime's check (`GUARD_CALLBACK`); valid while this machine's memory limit is at least this much
#: (`runtime/vm_program.py` runs the calls in the executor otherwise)
NATIVE_GUARD_BYTES = 1 << 28
#: a function of the program's library returning the walk positions (`node_keys`' numbers, a shape) of the nodes
#: the program calls `KERNEL_CALLBACK` for on every run; the others keyed (a `topk` / `slice` with tensor operands)
#: call it back only for a failing check, to raise the op's error. The C++ runner needs kernels for the first only.
CALLBACKS_FUNCTION = "dyntvm_callbacks"
#: a function present in a program's library whose kernels assume only element alignment of their arguments (TVM's
#: default: 64 bytes; `codegen/backends/cpu/cpu_alignment.py`): the runtime then passes a contiguous numpy input as it
#: is, where it would otherwise copy one not 64-byte aligned (numpy gives 16) into an aligned buffer
ELEMENT_ALIGNED_FUNCTION = "dyntvm_element_aligned"


def _tensor_typed(values) -> bool:
    return not any(isinstance(v.type, ListType) for v in values)


def unsupported_nodes(graph: Graph) -> list:
    """``(node, why)`` of every node (whole tree) the VM program cannot run; empty when it runs all of them
    (codegen may still fail to build it: the library then has no program, `runtime/vm_program.status`)."""
    out: list = []
    if not _tensor_typed(graph.inputs) or not _tensor_typed(graph.outputs):
        out.append((None, "list inputs or outputs"))
    _walk(graph, out)
    return out


def _walk(g: Graph, out: list) -> None:
    for n in g.nodes:
        why = _why_not(n)
        if why is not None:
            out.append((n, why))
            continue
        if n.op in ("cond", "case", "foreach", "while_loop"):
            for s in n.subgraphs:
                _walk(s, out)


def _why_not(n: Node):
    if n.op == "constant":
        return None if _tensor_typed(n.outputs) else "a list constant"
    if not _tensor_typed(n.inputs) or not _tensor_typed(n.outputs):
        return "a list value"
    if n.op == "region":
        return "run-time dim checks" if any(m.checks for m in n.subgraphs[0].nodes) else None
    if n.checks:
        return "run-time dim checks"
    if n.op == "cond":
        return None
    if n.op == "case":
        return "an exclusive case" if n.attrs.exclusive else None
    if n.op == "foreach":
        if n.attrs.has_valid_length:
            return "a foreach with valid_length (not in the VM yet)"
        return None if n.attrs.num_data else "a foreach without data"
    if n.op == "while_loop":          # without a compiled loop: recursive functions (`codegen/vm_program.py`)
        rows = n.subgraphs[1].outputs[:len(n.outputs) - n.attrs.num_vars]
        if while_loop_plan(n) is None and not all(isinstance(d, int) for v in rows for d in v.type.shape):
            return "a while_loop with per-step outputs of data-dependent shape and no compiled loop"
        return None
    if n.opdef.kind == OpKind.CONTROL_FLOW:
        return f"control flow {n.op} (not in the VM yet)"
    if n.opdef.dim_attrs:             # a static op's symbols bound by its inputs' dims: its converter runs
        bound = set().union(*(v.type.symbols() for v in n.inputs))
        if n.opdef.kind == OpKind.STATIC and attr_symbols(n.op, n.attrs) <= bound:
            return None
        return "an op with symbolic attrs"
    return None


def node_keys(graph: Graph, prefix: str) -> dict:
    """``{node: key}`` for the nodes the program calls back into Python for, in a fixed order (whole tree,
    depth first): the dynamic-shape nodes (`KERNEL_CALLBACK`) and the regions whose sizes the runtime checks
    before they run (`GUARD_CALLBACK`, `ir.region_counts`). The key is `prefix` (the binding compiled into the
    model's library, `codegen.build.add_binding`: models share keys only where their graphs are the same) and
    the node's position."""
    keys = {}
    for i, n in enumerate(graph.walk()):
        if n.op == "region" and amplified_counts(n) or \
                n.op not in ("constant", "region") and n.opdef.kind != OpKind.CONTROL_FLOW:
            keys[n] = f"{prefix}:{i}"
    return keys


def native(n: Node) -> bool:
    """Whether node `n` (outside regions, not control flow) runs as kernels in the program
    (`codegen/vm_dynamic.py`), else as a Python callback: a static op (a view the partitioner left out of
    regions) through its region converter (should that fail when the program is built, it is called back),
    and the common forms of dynamic-shape ops."""
    if n.opdef.kind == OpKind.STATIC:
        return n.op != "constant"
    if n.op == "boolean_mask":
        t, m = n.inputs[0].type, n.inputs[1].type
        return t.ndim >= 1 and n.attrs.axis % t.ndim == 0 and m.ndim == 1 and m.dtype == "bool"
    if n.op == "nonzero":
        return n.inputs[0].type.ndim == 1
    if n.op == "slice_dyn":           # (F.slice casts bounds to int64; uint64 ones past 2**63 would wrap here)
        bounds = n.inputs[1:]
        return n.inputs[0].type.ndim >= 1 and all(v.type.ndim == 1 and v.type.dtype != "uint64" for v in bounds)
    if n.op == "topk_dyn":
        t, k = n.inputs[0].type, n.inputs[1].type
        one_k = all(isinstance(d, int) for d in k.shape) and int(np.prod(k.shape, dtype=np.int64)) == 1
        return t.ndim >= 1 and one_k and \
            np.dtype(k.dtype).kind in "iu" and _SORTABLE.match(t.dtype) is not None
    return False


_SORTABLE = re.compile(r"^(float(16|32|64)|u?int(8|16|32|64)|bool)$")


def python_callbacks(graph: Graph) -> list:
    """The nodes the program would call back into Python for: a dynamic-shape op's numpy kernel, a region's size
    check (the graph and its control-flow bodies; a region's own nodes are kernels)."""
    out = []
    for n in graph.nodes:
        if n.op == "region":
            if amplified_counts(n):
                out.append(n)
        elif n.op in ("cond", "case", "foreach", "while_loop"):
            for s in n.subgraphs:
                out.extend(python_callbacks(s))
        elif n.op != "constant" and n.opdef.kind != OpKind.CONTROL_FLOW and not native(n):
            out.append(n)
    return out


def describe(unsupported: list) -> list:
    """One line per node the VM program cannot run, for `print(model)` and `dyntvm inspect`."""
    return [f"{n.op} node {n.name!r}: {why}" if n is not None else why for n, why in unsupported]
