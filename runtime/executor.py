"""The imperative executor: runs a partitioned graph with compiled regions.

Each graph (top level and every subgraph) is turned once into a *plan*: values get integer slots,
each node becomes a small closure. Running a graph is then a loop over closures on a list — no dict
lookups, no re-tracing, no recompilation. Region node -> one call into the TVM VM; dynamic-shape node
-> numpy kernel; control-flow node -> its subgraph plans, driven by the shared runner
(`control_flow.py`) from Python. Values stay TVM tensors between regions; crossings to numpy are zero-copy
views. A failing step raises an `ExecutionError` naming its node, found only once something failed: the
success path pays nothing for it.
"""
from __future__ import annotations

import math
import time
from collections import defaultdict

import numpy as np

from tvm_ffi._ffi_api import ArrayGetItem

from dyntvm.errors import CompileError, ExecutionError

from ..ir.graph import Graph, Node
from ..ir.list_type import ListType, value_dims, value_shape
from ..ir.ops import mask_gather_name
from ..ir.ops_lists import LIST_OPS
from ..ir.types import eval_dim
from . import control_flow as cf
from .control_flow import bind_symbols
from .dim_check_run import checked_step, region_checks
from .interpreter import Interpreter, last_uses
from .kernels import KERNELS
from .lists import host_list
from .loop_calls import compiled_foreach, compiled_while, pick_by_sizes
from .node_errors import node_failure, note_within
from .region_sizes import size_guard
from .tensors import aligned_empty, aligned_rows, first_truth, host_array, to_numpy, to_tvm

_item = ArrayGetItem            # res[k] of a region's result tuple: one FFI call (Array.__getitem__ makes two)


class Plan:
    __slots__ = ("graph", "n_slots", "template", "in_idx", "out_idx", "steps", "nodes", "slot", "env_slot")

    def run(self, args):
        slots = self.template.copy()
        for i, a in zip(self.in_idx, args):
            slots[i] = a
        if self.env_slot is not None:         # symbol values for numpy ops with symbolic attrs
            slots[self.env_slot] = env = {}
            for v, a in zip(self.graph.inputs, args):
                bind_symbols(v.type, value_shape(a), env)
        try:
            for step in self.steps:
                step(slots)
        except ExecutionError as e:           # raised inside a control-flow node: names its innermost node
            note_within(e, self.nodes[self.steps.index(step)])
            raise
        except Exception as e:
            raise self.failure(step, slots, e) from e
        return [slots[i] for i in self.out_idx]

    def failure(self, step, slots, cause) -> ExecutionError:
        node = self.nodes[self.steps.index(step)]
        if node.op == "region":
            return region_failure(node, [slots[self.slot[v]] for v in node.inputs], cause)
        return node_failure(node, cause)


class Executor:
    """Runs `graph` (partitioned) with region functions from `vm` (a relax.VirtualMachine or None).

    One executor serves one thread at a time: a Relax VM keeps per-call frames, and the plans hold its
    functions (`CompiledModel` gives each thread its own VM and executor).

    Args:
        validate: after every region call, re-run the region with the numpy reference and compare.
        profile: collect wall time per node into `self.profile` (name -> [calls, seconds]).
        constants: the graph's constants already converted to TVM tensors (node id -> tensor), shared
            read-only between the executors of one model; filled here when empty.
        placement: a `placement.DevicePlacement` when the kernels run on a device (a GPU): values stay
            there, and what crosses to the host is counted. None: the CPU (zero-copy numpy <-> TVM).
    """
    program = None      # the VM program's runner (`runtime/vm_program.ProgramRunner`), set by the model

    def __init__(self, graph: Graph, vm=None, validate: bool = False, profile: bool = False,
                 constants: dict | None = None, placement=None, specialized: dict | None = None):
        self.graph, self.vm = graph, vm
        self.specialized = specialized or {}    # region -> [(sizes of its symbols, function)] (tuning logs)
        self.pl = placement                 # a DevicePlacement when the kernels run on a device, else None
        self.validate, self.profiling = validate, profile
        self.profile: dict = defaultdict(lambda: [0, 0.0])
        self.calls = [0, 0]                 # region calls, of them to a specialization (a list: read by the
        #                                     model after this executor dies)
        self._plans: dict = {}
        self._guards: dict = {}             # region name -> its size guard (regions of one name are equal)
        self.constants = {} if constants is None else constants
        self.constant_ids: set = set()      # constants handed out as outputs must be copied
        self.plan = self._plan(graph)

    @property
    def kernel_calls(self) -> int:
        return self.calls[0]

    def run(self, args: list) -> list:
        return self.plan.run(args)

    # ------------------------------------------------------------------------------- planning
    def _plan(self, g: Graph) -> Plan:
        got = self._plans.get(id(g))
        if got is not None:
            return got
        p = Plan()
        p.graph = g
        slot = p.slot = {}
        for v in g.values():
            slot[v] = len(slot)
        p.n_slots = len(slot)
        # numpy ops with symbolic attrs read the symbol values from one more slot, a dict filled from the
        # inputs and from each value as it is produced (the value that had a symbol may be freed by then)
        needs_env = any(n.opdef.dim_attrs and n.op != "region" for n in g.nodes)
        p.env_slot = p.n_slots if needs_env else None
        p.template = [None] * (p.n_slots + needs_env)
        p.in_idx = [slot[v] for v in g.inputs]
        p.out_idx = [slot[v] for v in g.outputs]
        frees = last_uses(g)
        p.steps, p.nodes = [], []           # parallel lists: a failing step's node is found by position
        for i, n in enumerate(g.nodes):
            if n.op == "constant":
                # converted once per model: constants then cross into regions without per-call copies
                t = self.constants.get(id(n))
                if t is None:
                    t = self.constants[id(n)] = (self.pl.to_device if self.pl else to_tvm)(n.attrs.value)
                p.template[slot[n.outputs[0]]] = t
                self.constant_ids.add(id(t))
                continue
            ins = [slot[v] for v in n.inputs]
            outs = [slot[v] for v in n.outputs]
            maker = getattr(self, "_make_" + n.op, None) or (
                self._make_region if n.op == "region" else self._make_kernel)
            step = checked_step(maker(n, ins, outs, g), n, ins, self._dim_origins)   # itself where no checks
            if needs_env:
                step = self._with_binding(step, n, outs, p.env_slot)
            free = [slot[v] for v in frees.get(i, ()) if v.producer is None or v.producer.op != "constant"]
            if free:
                step = self._with_free(step, free)
            if self.profiling:
                step = self._with_profile(step, n)
            p.steps.append(step)
            p.nodes.append(n)
        self._plans[id(g)] = p
        return p

    def _dim_origins(self) -> dict:
        return self.graph.dim_origins

    @staticmethod
    def _with_free(step, free):
        def run(slots):
            step(slots)
            for i in free:
                slots[i] = None
        return run

    @staticmethod
    def _with_binding(step, n: Node, outs, env_slot):
        typed = [(n.outputs[k].type, o) for k, o in enumerate(outs)
                 if any(isinstance(d, str) for d in value_dims(n.outputs[k].type))]
        if not typed:
            return step

        def run(slots):
            step(slots)
            env = slots[env_slot]
            for t, o in typed:
                bind_symbols(t, value_shape(slots[o]), env)
        return run

    def _with_profile(self, step, n: Node):
        rec = self.profile[f"{n.name or n.op} ({n.op})"]

        def run(slots):
            t0 = time.perf_counter()
            step(slots)
            rec[0] += 1
            rec[1] += time.perf_counter() - t0
        return run

    # ---------------------------------------------------------------------------------- nodes
    def _make_region(self, n: Node, ins, outs, g):
        if self.vm is None:
            raise CompileError(f"region {n.attrs.name} has no compiled module")
        fn = self.vm[n.attrs.name]
        sub = n.subgraphs[0]
        validate = self.validate
        calls = self.calls
        pick = self._specialized(n, fn)
        guard = self._size_guard(n)
        if self.pl is not None:
            return self._device_region(n, fn, sub, ins, outs, pick, guard)

        def run(slots):
            args = [to_tvm(slots[i]) for i in ins]
            if guard is not None:
                guard(args)
            res = (fn if pick is None else pick(args))(*args)
            calls[0] += 1
            for k, o in enumerate(outs):
                slots[o] = _item(res, k)
            if validate:
                _check_region(n, sub, [slots[i] for i in ins], [slots[o] for o in outs])
        return run

    def _size_guard(self, region: Node):
        name = region.attrs.name
        if name not in self._guards:
            self._guards[name] = size_guard(region)
        return self._guards[name]

    def _specialized(self, n: Node, fn):
        """``pick(args) -> function`` for a region with specializations (a tuning log's hinted sizes): the one
        compiled for the sizes of `args`, else the generic `fn`. None for other regions."""
        specs = self.specialized.get(n.attrs.name)
        if not specs:
            return None
        return pick_by_sizes(specs, n.subgraphs[0].inputs, lambda name: self.vm[name], fn, self.calls)

    def _device_region(self, n: Node, fn, sub, ins, outs, pick=None, guard=None):
        """A region on a device: inputs moved there once (kept in their slots), outputs left there."""
        pl, validate, calls = self.pl, self.validate, self.calls
        on_device, to_device = pl.on_device, pl.to_device

        def run(slots):
            args = []
            for i in ins:
                x = slots[i]
                if not on_device(x):
                    x = slots[i] = to_device(x)
                args.append(x)
            if guard is not None:
                guard(args)
            res = (fn if pick is None else pick(args))(*args)
            calls[0] += 1
            for k, o in enumerate(outs):
                slots[o] = _item(res, k)
            if validate:
                _check_region(n, sub, [slots[i] for i in ins], [slots[o] for o in outs])
        return run

    def _make_kernel(self, n: Node, ins, outs, g):
        kern = KERNELS[n.op]
        attrs = n.attrs
        if self.pl is not None and n.op == "boolean_mask":
            step = self._device_boolean_mask(n, kern, ins, outs)
            if step is not None:
                return step
        host = self.pl.read if self.pl else to_numpy         # dynamic-shape ops run in numpy, on the host
        if self.pl is not None and n.opdef.shape_only:
            host = self.pl.shape_stub                        # e.g. shape_of: no copy at all
        if n.op in LIST_OPS:                                 # lists hold tensors: each element to the host
            to_host = host

            def host(x):
                return host_list(x, to_host) if isinstance(x, list) else to_host(x)
        if n.opdef.dim_attrs:
            env_slot = len(dict.fromkeys(g.values()))     # see Plan.env_slot

            def run(slots):
                res = kern(attrs, *[host(slots[i]) for i in ins], env=slots[env_slot])
                for o, r in zip(outs, res):
                    slots[o] = r
            return run

        def run(slots):
            res = kern(attrs, *[host(slots[i]) for i in ins])
            for o, r in zip(outs, res):
                slots[o] = r
        return run

    def _device_boolean_mask(self, n: Node, kern, ins, outs):
        """boolean_mask on a device: only the mask crosses to the host; its indices come back and the library's
        gather kernel (`ir.ops.mask_gather_name`) takes the rows on the device. None when the library has no
        such kernel (a graph without compiled regions): the numpy kernel runs instead."""
        t = n.inputs[0].type
        if self.vm is None or not t.ndim:
            return None
        try:
            gather = self.vm[mask_gather_name(t.dtype, t.ndim, n.attrs.axis)]
        except Exception:  # noqa: BLE001 - AttributeError from the VM: not in this library
            return None
        pl, attrs, axis = self.pl, n.attrs, n.attrs.axis % t.ndim
        out = outs[0]

        def run(slots):
            data, mask_t = slots[ins[0]], slots[ins[1]]
            mask = pl.read(mask_t)
            if mask.ndim != 1 or tuple(data.shape)[axis] != mask.shape[0]:     # the kernel's error, as eager
                slots[out] = kern(attrs, pl.read(data), mask)[0]
                return
            if not pl.on_device(data):
                data = slots[ins[0]] = pl.to_device(data)
            slots[out] = gather(data, pl.gather_indices(mask_t, mask))[0]
        return run

    # ------------------------------------------------------- control flow (the shared runner)
    def _make_cond(self, n: Node, ins, outs, g):
        then_run, else_run = (self._plan(s).run for s in n.subgraphs)
        truth = self.pl.truth if self.pl else _truth
        args_of = self._branch_args(ins[1:])

        def run(slots):
            res = cf.cond(slots[ins[0]], then_run, else_run, args_of(slots), truth=truth)
            for o, r in zip(outs, res):
                slots[o] = r
        return run

    def _make_case(self, n: Node, ins, outs, g):
        runs = [self._plan(s).run for s in n.subgraphs]
        preds, branches = runs[0:-1:2], runs[1::2] + runs[-1:]
        truth = self.pl.first_truth if self.pl else first_truth
        args_of = self._branch_args(ins)
        exclusive = n.attrs.exclusive                  # read once, not on every call

        def run(slots):
            res = cf.case(preds, branches, args_of(slots), truth=truth, exclusive=exclusive)
            for o, r in zip(outs, res):
                slots[o] = r
        return run

    def _branch_args(self, ins):
        """The values a control-flow node hands to its subgraphs. On a device they move there first, once (a
        subgraph cannot keep a moved value in its caller's slots, so each subgraph would copy it again)."""
        if self.pl is None:
            return lambda slots: [slots[i] for i in ins]
        move = self.pl.to_device

        def to_device(x):                     # a list stays a list of tensors there
            return [move(e) for e in x] if isinstance(x, list) else move(x)

        def args_of(slots):
            for i in ins:
                slots[i] = to_device(slots[i])
            return [slots[i] for i in ins]
        return args_of

    def _loop_consts(self, ins):
        """A loop's captures, made tensors of the kernels' device once per loop, not once per step."""
        if self.pl is not None:
            return self._branch_args(ins)
        return lambda slots: [slots[i] if isinstance(slots[i], list) else to_tvm(slots[i]) for i in ins]

    def _make_foreach(self, n: Node, ins, outs, g):
        a = n.attrs
        body = n.subgraphs[0]
        body_run = self._plan(body).run
        nd, ns = a.num_data, a.num_states
        if a.has_valid_length:
            return self._foreach_valid_length(n, ins, outs, body, body_run)
        if self.pl is not None:
            pl = self.pl

            args_of = self._branch_args(ins)

            def run_on_device(slots):
                args = args_of(slots)
                data, states, caps = args[:nd], args[nd:nd + ns], args[nd + ns:]
                stacked, states = cf.foreach(body_run, data, states, caps, body, rows=pl.rows, to_array=pl.to_device,
                                             alloc=pl.alloc)
                for o, r in zip(outs, pl.stacked(stacked) + list(states)):
                    slots[o] = r
            return compiled_foreach(self, n, ins, outs, run_on_device) or run_on_device

        direct = self._direct_body(body)
        caps_of = self._loop_consts(ins[nd + ns:])

        def run(slots):
            data = [to_numpy(slots[i]) for i in ins[:nd]]
            states = [slots[i] for i in ins[nd:nd + ns]]
            caps = caps_of(slots)
            if direct is not None:
                stacked, states = cf.foreach(direct, data, [to_tvm(x) for x in states], caps, body, rows=_direct_rows,
                                             to_array=to_numpy, alloc=aligned_empty)
            else:
                stacked, states = cf.foreach(body_run, data, states, caps, body, rows=aligned_rows, to_array=to_numpy,
                                             alloc=aligned_empty)     # zero-copy 64-byte aligned rows into regions
            for o, r in zip(outs, stacked + list(states)):
                slots[o] = r
        return compiled_foreach(self, n, ins, outs, run) or run

    def _foreach_valid_length(self, n: Node, ins, outs, body, body_run):
        """foreach with valid_length (`control_flow.foreach_valid_length`): the rows of each step are gathered,
        scattered and zero-filled in host buffers; on a device its values cross to the host for that (correct,
        not fast), the captures move to the device once."""
        nd, ns = n.attrs.num_data, n.attrs.num_states
        to_array = self.pl.to_host if self.pl else to_numpy
        caps_of = self._loop_consts(ins[nd + ns + 1:])

        def run(slots):
            stacked, states = cf.foreach(body_run, [to_array(slots[i]) for i in ins[:nd]],
                                         [slots[i] for i in ins[nd:nd + ns]], caps_of(slots), body,
                                         rows=aligned_rows, to_array=to_array, alloc=aligned_empty,
                                         valid_length=to_array(slots[ins[nd + ns]]))
            for o, r in zip(outs, stacked + list(states)):
                slots[o] = r
        return run

    def _make_while_loop(self, n: Node, ins, outs, g):
        a = n.attrs
        cond_g, body = n.subgraphs
        cond_run, body_run = self._plan(cond_g).run, self._plan(body).run
        nv = a.num_vars
        has_t, static_max, in_body = a.has_max_tensor, a.max_iterations, a.cond_in_body
        if self.pl is not None:
            pl = self.pl

            vars_of = self._branch_args(ins[:nv] + ins[nv + (1 if has_t else 0):])

            def run_on_device(slots):
                limit = pl.to_host(slots[ins[nv]]) if has_t else static_max
                args = vars_of(slots)
                stacked, vars_ = cf.while_loop(cond_run, body_run, args[:nv], args[nv:], limit, body,
                                               truth=pl.first_truth, to_array=pl.to_device, stack=pl.stack_rows,
                                               cond_in_body=in_body)
                for o, r in zip(outs, stacked + list(vars_)):
                    slots[o] = r
            return compiled_while(self, n, ins, outs, run_on_device, cond_run, vars_of) or run_on_device

        direct = self._direct_body(body) if in_body else None
        caps_of = self._loop_consts(ins[nv + (1 if has_t else 0):])

        def run(slots):
            limit = slots[ins[nv]] if has_t else static_max
            caps = caps_of(slots)
            vars_ = [slots[i] for i in ins[:nv]]
            if direct is not None:
                vars_ = [to_tvm(x) for x in vars_]
            stacked, vars_ = cf.while_loop(cond_run, direct or body_run, vars_, caps, limit, body,
                                           truth=first_truth, to_array=to_numpy, cond_in_body=in_body)
            for o, r in zip(outs, stacked + list(vars_)):
                slots[o] = r
        return compiled_while(self, n, ins, outs, run, cond_run, caps_of) or run

    def _direct_body(self, g: Graph):
        """A loop body that is one region and nothing else, run without a plan: ``run(args) -> outputs``, where
        the args are TVM tensors or numpy arrays that may cross as they are (64-byte aligned, contiguous,
        writeable: `_direct_rows`). A step then costs the region call and little more. None for other bodies,
        on a device, and while validating or profiling (the plan does those)."""
        if self.validate or self.profiling or self.pl is not None or self.vm is None or len(g.nodes) != 1 or \
                g.nodes[0].op != "region" or region_checks(g.nodes[0]) or \
                any(isinstance(v.type, ListType) for v in g.inputs):    # the plan runs the checks; lists: no TVM
            return None
        region = g.nodes[0]
        pos = {v: k for k, v in enumerate(g.inputs)}
        made = {v: k for k, v in enumerate(region.outputs)}
        if not all(v in pos for v in region.inputs) or not all(v in made or v in pos for v in g.outputs):
            return None
        arg_idx = [pos[v] for v in region.inputs]
        out_map = [made[v] if v in made else ~pos[v] for v in g.outputs]
        fn, calls = self.vm[region.attrs.name], self.calls
        pick = self._specialized(region, fn)
        guard = self._size_guard(region)

        def run(args):
            ins = [args[i] for i in arg_idx]
            try:
                if guard is not None:
                    guard(ins)
                res = (fn if pick is None else pick(ins))(*ins)
            except Exception as e:
                raise region_failure(region, ins, e) from e
            calls[0] += 1
            return [_item(res, j) if j >= 0 else args[~j] for j in out_map]
        return run


def _direct_rows(a: np.ndarray) -> list:
    """`aligned_rows`, which a direct body (`Executor._direct_body`) takes as they are; empty rows as TVM tensors."""
    rows = aligned_rows(a)
    return [to_tvm(r) for r in rows] if rows and not rows[0].size else rows


def _truth(x) -> bool:
    return bool(to_numpy(x))


def region_failure(node: Node, ins: list, cause: BaseException) -> ExecutionError:
    """A region call failed: re-run the region with the numpy reference (only now, on the error path) to
    name the op inside it that fails, with its source line; else name the region, its ops and their lines.
    Out of memory, it is not re-run: the error names the largest value the region computes instead."""
    if isinstance(cause, MemoryError) or "bad_alloc" in str(cause):
        return _memory_failure(node, ins, cause)
    try:
        Interpreter(node.subgraphs[0]).run(*[host_array(x) for x in ins])
    except ExecutionError as inner:
        err = ExecutionError(inner.args[0], op=inner.op, node=inner.node, source=inner.source)
        err.within = inner.within + [f"in region node {node.name!r}, whose compiled code raised: "
                                     f"{str(cause).strip() or type(cause).__name__}"]
        return err
    except Exception:  # noqa: BLE001 - the reference cannot run these inputs either: name the region
        pass
    inner = [m for m in node.subgraphs[0].nodes if m.op != "constant"]
    ops = sorted({m.op for m in inner})
    sources = list(dict.fromkeys(m.source for m in inner if m.source))
    detail = f"\n    (the region computes {', '.join(ops)}" + \
        (f"; from {'; '.join(sources[:3])}{'; ...' if len(sources) > 3 else ''})" if sources else ")")
    return node_failure(node, cause, detail)


def _memory_failure(node: Node, ins: list, cause: BaseException) -> ExecutionError:
    """The region's largest value (of those sized by the input shapes) and the node computing it."""
    sub = node.subgraphs[0]
    env: dict = {}
    for v, x in zip(sub.inputs, ins):
        bind_symbols(v.type, tuple(x.shape), env)
    biggest = None
    for m in sub.nodes:
        for v in m.outputs:
            try:
                shape = [eval_dim(d, env) for d in v.type.shape]
            except (KeyError, ValueError):
                continue                # a size known only when it runs
            if any(d < 0 for d in shape):       # TVM allocates a negative size as a huge one: name the dim
                return node_failure(m, ValueError(f"a dim must be >= 0, got {v.type.dtype}{shape}"))
            size = math.prod(shape) * np.dtype(v.type.dtype).itemsize
            if biggest is None or size > biggest[0]:
                biggest = (size, shape, v.type.dtype, m)
    condition = f"out of memory ({str(cause).strip() or type(cause).__name__})"
    if biggest is not None:
        size, shape, dtype, m = biggest
        condition += f"; its largest value is {dtype}{shape} ({_bytes(size)}), from {m.op} node {m.name!r}" + \
            (f" at {m.source}" if m.source else "")
    return node_failure(node, MemoryError(condition))


def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


def _check_region(n: Node, sub: Graph, ins, outs):
    want = Interpreter(sub).run(*[host_array(x) for x in ins])
    for k, (w, o) in enumerate(zip(want, outs)):
        got = host_array(o)
        if got.shape != np.shape(w) or got.dtype != np.asarray(w).dtype or not np.allclose(
                got, w, rtol=1e-4, atol=1e-5, equal_nan=True):
            diff = "shape/dtype " + f"{got.dtype}{list(got.shape)} vs {np.asarray(w).dtype}{list(np.shape(w))}" \
                if got.shape != np.shape(w) or got.dtype != np.asarray(w).dtype else \
                f"max abs diff {np.max(np.abs(got.astype(np.float64) - np.asarray(w, np.float64)))}"
            raise CompileError(f"validate: region {n.attrs.name} output {k} differs from the numpy reference "
                               f"({diff})")
