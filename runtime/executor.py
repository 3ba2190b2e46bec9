"""The imperative executor: runs a partitioned graph with compiled regions.

Each graph (top level and every subgraph) is turned once into a *plan*: values get integer slots,
each node becomes a small closure. Running a graph is then a loop over closures on a list — no dict
lookups, no re-tracing, no recompilation. Region node -> one call into the TVM VM; dynamic-shape node
-> numpy kernel; control-flow node -> its subgraph plans, loops driven from Python. Values stay TVM
tensors between regions; crossings to numpy are zero-copy views.
"""
from __future__ import annotations

import time
from collections import defaultdict

import numpy as np

from dyntvm.errors import CompileError

from ..ir.graph import Graph, Node
from .interpreter import Interpreter, bind_symbols, last_uses, stack_steps, zero_length_stack
from .kernels import KERNELS
from .tensors import aligned_empty, aligned_rows, to_numpy, to_tvm


class Plan:
    __slots__ = ("graph", "n_slots", "template", "in_idx", "out_idx", "steps", "needs_env")

    def run(self, args):
        slots = self.template.copy()
        for i, a in zip(self.in_idx, args):
            slots[i] = a
        for step in self.steps:
            step(slots)
        return [slots[i] for i in self.out_idx]


class Executor:
    """Runs `graph` (partitioned) with region functions from `vm` (a relax.VirtualMachine or None).

    Args:
        validate: after every region call, re-run the region with the numpy reference and compare.
        profile: collect wall time per node into `self.profile` (name -> [calls, seconds]).
    """

    def __init__(self, graph: Graph, vm=None, validate: bool = False, profile: bool = False):
        self.graph, self.vm = graph, vm
        self.validate, self.profiling = validate, profile
        self.profile: dict = defaultdict(lambda: [0, 0.0])
        self.kernel_calls = 0
        self._plans: dict = {}
        self.constant_ids: set = set()      # constants handed out as outputs must be copied
        self.plan = self._plan(graph)

    def run(self, args: list) -> list:
        return self.plan.run(args)

    # ------------------------------------------------------------------------------- planning
    def _plan(self, g: Graph) -> Plan:
        got = self._plans.get(id(g))
        if got is not None:
            return got
        p = Plan()
        p.graph = g
        slot = {}
        for v in g.values():
            slot[v] = len(slot)
        p.n_slots = len(slot)
        p.template = [None] * p.n_slots
        p.in_idx = [slot[v] for v in g.inputs]
        p.out_idx = [slot[v] for v in g.outputs]
        frees = last_uses(g)
        p.steps = []
        p.needs_env = False
        for i, n in enumerate(g.nodes):
            if n.op == "constant":
                # converted once: constants then cross into regions without per-call copies
                t = p.template[slot[n.outputs[0]]] = to_tvm(n.attrs.value)
                self.constant_ids.add(id(t))
                continue
            ins = [slot[v] for v in n.inputs]
            outs = [slot[v] for v in n.outputs]
            maker = getattr(self, "_make_" + n.op, None) or (
                self._make_region if n.op == "region" else self._make_kernel)
            step = maker(n, ins, outs, g)
            free = [slot[v] for v in frees.get(i, ()) if v.producer is None or v.producer.op != "constant"]
            if free:
                step = self._with_free(step, free)
            if self.profiling:
                step = self._with_profile(step, n)
            p.steps.append(step)
        self._plans[id(g)] = p
        return p

    @staticmethod
    def _with_free(step, free):
        def run(slots):
            step(slots)
            for i in free:
                slots[i] = None
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
        executor = self

        def run(slots):
            res = fn(*[to_tvm(slots[i]) for i in ins])
            executor.kernel_calls += 1
            for k, o in enumerate(outs):
                slots[o] = res[k]
            if validate:
                _check_region(n, sub, [slots[i] for i in ins], [slots[o] for o in outs])
        return run

    def _make_kernel(self, n: Node, ins, outs, g):
        kern = KERNELS[n.op]
        attrs = n.attrs
        if n.opdef.dim_attrs:
            def run(slots):
                res = kern(attrs, *[to_numpy(slots[i]) for i in ins], env=self._env(g, slots))
                for o, r in zip(outs, res):
                    slots[o] = r
            return run

        def run(slots):
            res = kern(attrs, *[to_numpy(slots[i]) for i in ins])
            for o, r in zip(outs, res):
                slots[o] = r
        return run

    def _env(self, g: Graph, slots) -> dict:
        """Symbol values from every value currently held (rarely needed: symbolic attrs on a numpy op)."""
        env: dict = {}
        for v, s in zip(g.values(), slots):
            if s is not None:
                bind_symbols(v.type, s.shape, env)
        return env

    def _make_cond(self, n: Node, ins, outs, g):
        then_p, else_p = (self._plan(s) for s in n.subgraphs)

        def run(slots):
            p = then_p if bool(to_numpy(slots[ins[0]])) else else_p
            for o, r in zip(outs, p.run([slots[i] for i in ins[1:]])):
                slots[o] = r
        return run

    def _make_case(self, n: Node, ins, outs, g):
        plans = [self._plan(s) for s in n.subgraphs]
        k = n.attrs.num_cases

        def run(slots):
            args = [slots[i] for i in ins]
            chosen = plans[2 * k]
            for c in range(k):
                if bool(to_numpy(plans[2 * c].run(args)[0])):
                    chosen = plans[2 * c + 1]
                    break
            for o, r in zip(outs, chosen.run(args)):
                slots[o] = r
        return run

    def _make_foreach(self, n: Node, ins, outs, g):
        a = n.attrs
        body = self._plan(n.subgraphs[0])
        nd, ns, no = a.num_data, a.num_states, a.num_outputs
        out_types = [v.type for v in n.subgraphs[0].outputs[:no]]

        def run(slots):
            data = [to_numpy(slots[i]) for i in ins[:nd]]
            length = data[0].shape[0]
            for k, d in enumerate(data[1:]):
                if d.shape[0] != length:
                    raise ValueError(f"foreach: data[{k + 1}] has length {d.shape[0]}, data[0] has {length}")
            rows = [aligned_rows(d) for d in data]       # zero-copy per-step slices into regions
            states = [slots[i] for i in ins[nd:nd + ns]]
            caps = [to_tvm(slots[i]) if isinstance(slots[i], np.ndarray) else slots[i] for i in ins[nd + ns:]]
            bufs = None
            for t in range(length):
                res = body.run([r[t] for r in rows] + states + caps)
                if bufs is None:
                    bufs = [aligned_empty((length,) + tuple(r.shape), _dtype(r)) for r in res[:no]]
                for k, (buf, r) in enumerate(zip(bufs, res[:no])):
                    r = to_numpy(r)
                    if r.shape != buf.shape[1:]:
                        raise ValueError(f"foreach: step output {k} changed shape between iterations "
                                         f"({list(buf.shape[1:])} then {list(r.shape)}); per-step outputs "
                                         "are stacked and must keep one shape")
                    buf[t] = r
                states = res[no:]
            if bufs is None:
                env: dict = {}
                shapes = [d.shape[1:] for d in data] + [s.shape for s in states + caps]
                for v, s in zip(n.subgraphs[0].inputs, shapes):
                    bind_symbols(v.type, tuple(s), env)
                bufs = [zero_length_stack(t, env) for t in out_types]
            for o, r in zip(outs, list(bufs) + list(states)):
                slots[o] = r
        return run

    def _make_while_loop(self, n: Node, ins, outs, g):
        a = n.attrs
        cond_p, body_p = (self._plan(s) for s in n.subgraphs)
        nv, no = a.num_vars, a.num_outputs
        body_graph = n.subgraphs[1]
        has_t, static_max = a.has_max_tensor, a.max_iterations

        def run(slots):
            vars_ = [slots[i] for i in ins[:nv]]
            limit = int(to_numpy(slots[ins[nv]])) if has_t else static_max
            caps = [slots[i] for i in ins[nv + (1 if has_t else 0):]]
            steps = [[] for _ in range(no)]
            it = 0
            while (limit is None or it < limit) and bool(to_numpy(cond_p.run(vars_ + caps)[0])):
                res = body_p.run(vars_ + caps)
                for acc, r in zip(steps, res[:no]):
                    acc.append(to_numpy(r))
                vars_ = res[no:]
                it += 1
            try:
                stacked = stack_steps(body_graph, steps, it, [tuple(x.shape) for x in vars_ + caps])
            except ValueError as e:
                raise ValueError(f"while_loop: {e}") from None
            for o, r in zip(outs, stacked + list(vars_)):
                slots[o] = r
        return run


def _dtype(x):
    return x.dtype if isinstance(x, np.ndarray) else np.dtype(str(x.dtype))


def _check_region(n: Node, sub: Graph, ins, outs):
    want = Interpreter(sub).run(*[to_numpy(x) for x in ins])
    for k, (w, o) in enumerate(zip(want, outs)):
        got = to_numpy(o)
        if got.shape != np.shape(w) or got.dtype != np.asarray(w).dtype or not np.allclose(
                got, w, rtol=1e-4, atol=1e-5, equal_nan=True):
            diff = "shape/dtype " + f"{got.dtype}{list(got.shape)} vs {np.asarray(w).dtype}{list(np.shape(w))}" \
                if got.shape != np.shape(w) or got.dtype != np.asarray(w).dtype else \
                f"max abs diff {np.max(np.abs(got.astype(np.float64) - np.asarray(w, np.float64)))}"
            raise CompileError(f"validate: region {n.attrs.name} output {k} differs from the numpy reference "
                               f"({diff})")
