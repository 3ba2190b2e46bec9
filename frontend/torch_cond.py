"""`from_torch`'s `torch.cond`: `F.cond`, with what it takes to run as fast as the same model written with `F`.

* **The widths torch asserts.** Where a cond's branches return different sizes, torch.export gives the axis an
  unbacked size ``u0`` and asserts the range it saw (``u0 >= 24``, ``u0 <= 32``) after the cond. dyntvm gives the
  axis an unknown dim too, and records here the sizes each branch gives it (`Interpreter.dim_choices`, through
  nested conds). A size comparison on such a dim that holds (or fails) for every choice is decided while
  importing, so no run-time check (a host `nonzero` and two region calls per cond) is left for it.
* **Nested conds become one `case`** (`merge_nested_conds`, run on the imported graph): torch has no `case`,
  so ``if a: ... elif b: ... else: ...`` is a cond in the else branch of a cond. When an else branch is only
  another cond (or case) and the 0-d values its predicate is computed from, the predicate moves out (0-d
  elementwise work, computed where the outer predicate is) and the two become one `case`: one control-flow
  node, as `F.case` writes it.
"""
from __future__ import annotations

import operator

from ..ir import attrs as A
from ..ir.graph import Graph, Node, Value, assign_names
from ..ir.ops import GROUPS, RAISE_ON_INTEGERS, Group
from ..ir.types import dim_compare, is_static_dim
from . import F
from .torch_control import _module, _pred, converter
from .torch_ops import CONVERTERS as OP_CONVERTERS
from .tracer import Tensor


@converter("higher_order.cond")
def _cond(interp, gm, node, args, kwargs):
    pred, _, _, operands = args
    then_gm, else_gm = _module(gm, node, 1), _module(gm, node, 2)
    operands = list(operands)
    p = _pred(pred)
    if isinstance(p, bool):                 # decided while tracing (a size test torch left in): the taken branch
        return tuple(interp.run(then_gm if p else else_gm, operands))
    branch_outs: dict = {}

    def branch(name, g):
        def run():
            branch_outs[name] = outs = tuple(interp.run(g, operands))
            return outs
        return run
    outs = tuple(F.cond(p, branch("then", then_gm), branch("else", else_gm)))
    _record_choices(interp.dim_choices, outs, list(branch_outs.values()))
    return outs


def _record_choices(choices: dict, outs, per_branch: list) -> None:
    """For each unknown dim the cond gave its results (a dim no branch has there), the sizes it may take: the
    branches' dims there (theirs in turn where a branch's dim is itself such a dim)."""
    for i, out in enumerate(outs):
        if not isinstance(out, Tensor):
            continue
        for axis, d in enumerate(out.shape):
            alts = [_key(b[i].shape[axis]) for b in per_branch if i < len(b) and isinstance(b[i], Tensor)]
            if len(alts) != len(per_branch) or _key(d) in alts:
                continue
            choices[_key(d)] = frozenset(c for a in alts for c in choices.get(a, (a,)))


def _key(d):
    """A dim as a plain int or str (a `SymDim` compared with an int asks the dim algebra, and may raise)."""
    return int(d) if is_static_dim(d) else str(d)


_OPS = {"lt": (operator.lt, "<"), "le": (operator.le, "<="), "gt": (operator.gt, ">"), "ge": (operator.ge, ">="),
        "eq": (operator.eq, "=="), "ne": (operator.ne, "!=")}


def decide_over_choices(choices: dict, op: str, a, b):
    """``a op b`` for dims of which one at least is a cond's unknown dim with recorded choices: True / False where
    every combination of the choices decides it so, else None."""
    if isinstance(a, Tensor) or isinstance(b, Tensor) or not isinstance(a, (int, str)) or \
            not isinstance(b, (int, str)):
        return None
    a, b = _key(a), _key(b)
    if a not in choices and b not in choices:
        return None
    fn, sym = _OPS[op]
    if a == b:                                 # one dim, not two independent choices
        return dim_compare(a, sym, b)
    results = set()
    for x in choices.get(a, (a,)):
        for y in choices.get(b, (b,)):
            r = fn(x, y) if isinstance(x, int) and isinstance(y, int) else dim_compare(x, sym, y)
            if r is None:
                return None
            results.add(bool(r))
    return results.pop() if len(results) == 1 else None


def _size_test(op: str):
    plain = OP_CONVERTERS[f"_operator.{op}"]

    def conv(interp, gm, node, args, kwargs):
        decided = decide_over_choices(interp.dim_choices, op, *args) if len(args) == 2 and not kwargs else None
        return decided if decided is not None else plain(*args, **kwargs)
    return conv


for _op in _OPS:
    converter(f"_operator.{_op}")(_size_test(_op))


# --------------------------------------------------------------------------- nested conds -> one case
def merge_nested_conds(graph: Graph) -> Graph:
    """`graph` (and its subgraphs) with each chain cond(p, T, cond(q, T2, E2)) made one case([p: T, q: T2], E2)
    (see the module docstring); names given to the new values, linted."""
    _merge_in(graph)
    assign_names(graph)
    return graph.lint()


def _merge_in(graph: Graph) -> None:
    nodes = []
    for n in graph.nodes:                      # outermost first: a whole chain becomes one case
        nodes += _as_case(n) if n.op == "cond" and not n.checks else [n]
    for n in nodes:
        for sg in n.subgraphs:
            _merge_in(sg)
    graph.nodes = nodes


def _inner(sub: Graph):
    """The cond / case `sub` ends in when `sub` is only that node and cheap 0-d nodes computing its predicate
    from `sub`'s inputs (so they may run before the branch is chosen), else None."""
    if not sub.nodes:
        return None
    x = sub.nodes[-1]
    if x.op not in ("cond", "case") or x.checks or list(sub.outputs) != list(x.outputs) or \
            (x.op == "case" and x.attrs.exclusive):
        return None
    pre = sub.nodes[:-1]
    if any(n.subgraphs or n.checks or n.op not in _CHEAP or any(v.type.ndim != 0 for v in n.outputs)
           for n in pre):
        return None
    made = {v for n in pre for v in n.outputs}
    read_by_branches = x.inputs[1:] if x.op == "cond" else x.inputs
    return None if any(v in made for v in read_by_branches) else x


#: ops that may run before the branch is chosen (on 0-d values): no error, no host work, no integer division
#: or power (an integer to a negative power raises: it must not run on a branch torch would not take)
_CHEAP = frozenset(op for g in (Group.FLOAT_UNARY, Group.UNARY, Group.PREDICATE, Group.ARITH, Group.COMPARE,
                                Group.LOGICAL) for op in GROUPS[g]
                   if op not in RAISE_ON_INTEGERS) | {"constant", "cast"}


def _as_case(n: Node) -> list:
    """[hoisted predicate nodes..., the case] for cond `n` whose else branch is a chain, else [n]."""
    then_g, else_g = n.subgraphs
    if _inner(else_g) is None:
        return [n]
    caps = list(n.inputs)                      # the case's inputs: the outer pred first, then the cond's captures
    pairs = [(("pred", n.inputs[0]), (then_g, n.inputs[1:]))]     # (predicate, branch) as (subgraph, its outer values)
    hoisted: list = []
    cur, cur_caps = else_g, list(n.inputs[1:])
    while (x := _inner(cur)) is not None:
        scope = dict(zip(cur.inputs, cur_caps))        # branch value -> outer value
        for p in cur.nodes[:-1]:
            hoisted.append(Node(p.op, tuple(scope[v] for v in p.inputs), p.attrs, p.outputs, (), p.source, p.name))
            scope.update((v, v) for v in p.outputs)
        outer = [scope[v] for v in x.inputs]
        if x.op == "cond":
            caps.append(outer[0])
            pairs.append((("pred", outer[0]), (x.subgraphs[0], outer[1:])))
            cur, cur_caps = x.subgraphs[1], outer[1:]
        else:
            pairs += [((x.subgraphs[2 * i], outer), (x.subgraphs[2 * i + 1], outer))
                      for i in range(x.attrs.num_cases)]
            cur, cur_caps = x.subgraphs[-1], outer
    caps = list(dict.fromkeys(caps + [v for _, (_, vs) in pairs for v in vs] + cur_caps))
    names = [f"{kind}{i}" for i in range(len(pairs)) for kind in ("pred", "branch")] + ["default"]
    graphs = [_rewrap(g, vs, caps, name) for (g, vs), name in
              zip([spec for pair in pairs for spec in pair] + [(cur, cur_caps)], names)]
    if any(g is None for g in graphs):
        return [n]                             # a branch reading one value twice: left as it was
    case = Node("case", tuple(caps), A.CaseAttrs(len(pairs), len(n.outputs)), n.outputs, tuple(graphs),
                n.source)                      # named by assign_names (region names come from node and subgraph names)
    for m in hoisted + [case]:
        for v in m.outputs:
            v.producer = m
    return hoisted + [case]


def _rewrap(sub, sub_caps, caps: list, name: str):
    """`sub` (its inputs standing for the outer values `sub_caps`) taking the case's inputs `caps` instead (a
    predicate given as ("pred", value): a subgraph returning that input); None where `sub` reads one outer value
    through two inputs."""
    if sub == "pred":
        inputs = [Value(v.type) for v in caps]
        return Graph(inputs, [], [inputs[caps.index(sub_caps)]], name=name)
    if len(set(sub_caps)) != len(sub_caps):
        return None
    by_outer = dict(zip(sub_caps, sub.inputs))
    inputs = [by_outer.get(v) or Value(v.type) for v in caps]
    return Graph(inputs, sub.nodes, sub.outputs, name=name, dim_origins=sub.dim_origins)
