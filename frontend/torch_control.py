"""`from_torch`'s converters of torch's higher-order ops: `while_loop`, `scan`, `map` to dyntvm control flow
(`cond`: torch_cond.py).

Each HOP node calls FX subgraphs (GraphModules, its get_attr arguments); a branch / body is the subgraph run by the
importer's `Interpreter` under the tracer, so `F.cond` / `F.while_loop` / `F.foreach` trace it into a closed
dyntvm subgraph as they trace a Python callable. Operands torch passes explicitly (`cond`'s operands, the loops'
additional inputs) are read by the bodies from the enclosing scope: the tracer turns them into captures.

dyntvm's loops are more general than torch's: a `while_loop` var may change shape between iterations (torch.export
refuses that; write it with `F.while_loop` directly, or see docs/torch.md), and `cond` branches may differ in shape
(dyntvm gives the differing axis an unknown dim).
"""
from __future__ import annotations

import os
import re

import numpy as np

from . import F
from .torch_ops import TorchImportError, dim_tensor
from .tracer import Tensor


def user_line(node) -> str:
    """'file.py:12: code' of the user's line torch recorded for `node` (the innermost frame of its stack trace)."""
    trace_text = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*([^\n]*)', trace_text)
    here = os.path.dirname(os.path.abspath(__file__))      # the user's frames, not nn.Linear's nor from_torch's
    own = [f for f in frames if f"{os.sep}torch{os.sep}" not in f[0] and not f[0].startswith(here)] or frames
    if not own:
        return ""
    path, line, code = own[-1]
    return f"{os.path.basename(path)}:{line}: {code.strip()}"


CONVERTERS: dict = {}


def converter(name):
    def reg(fn):
        CONVERTERS[name] = fn
        return fn
    return reg


def _module(gm, node, k: int):
    """The GraphModule of argument `k` of a HOP node (a get_attr)."""
    a = node.args[k]
    v = gm
    for part in a.target.split("."):
        v = getattr(v, part)
    return v


def _pred(p):
    """cond's predicate: a 0-d bool tensor (a [1] one reshaped), a Python bool, or a 0-d integer of a size test."""
    if isinstance(p, (bool, np.bool_)):
        return bool(p)
    if isinstance(p, Tensor):
        p = F.reshape(p, ()) if p.ndim else p
        return p if p.dtype == np.bool_ else F.not_equal(p, 0)
    return p


@converter("higher_order.while_loop")
def _while_loop(interp, gm, node, args, kwargs):
    carried, additional = list(args[2]), list(args[3]) if len(args) > 3 else []
    cond_gm, body_gm = _module(gm, node, 0), _module(gm, node, 1)
    if any(not isinstance(c, Tensor) for c in carried):     # an int carried (a loop counter): as a 0-d tensor
        carried = [c if isinstance(c, Tensor) else dim_tensor(c) for c in carried]

    def cond_fn(*vs):
        (p,) = interp.run(cond_gm, list(vs) + additional)
        return _pred(p) if isinstance(p, Tensor) else np.bool_(bool(p))

    def body_fn(*vs):
        return [_tensor(v) for v in interp.run(body_gm, list(vs) + additional)]
    return tuple(F.while_loop(cond_fn, body_fn, carried))


def _tensor(v):
    return dim_tensor(v) if not isinstance(v, (Tensor, np.ndarray)) else v


@converter("higher_order.scan")
def _scan(interp, gm, node, args, kwargs):
    body_gm = _module(gm, node, 0)
    init, xs = list(args[1]), list(args[2])
    additional = list(args[3]) if len(args) > 3 else []
    if not xs:
        raise TorchImportError("scan over no xs: nothing sets the number of steps")
    n_carry = len(init)

    def body(x, states):
        x = x if isinstance(x, list) else [x]
        outs = interp.run(body_gm, list(states) + x + additional)
        return list(outs[n_carry:]), list(outs[:n_carry])
    ys, final = F.foreach(body, xs, init)
    return tuple(list(final) + list(ys))


@converter("higher_order.map_impl")
def _map(interp, gm, node, args, kwargs):
    body_gm = _module(gm, node, 0)
    xs, pos = list(args[1]), list(args[2]) if len(args) > 2 else []

    def body(x, states):
        x = x if isinstance(x, list) else [x]
        return list(interp.run(body_gm, x + pos)), []
    ys, _ = F.foreach(body, xs, [])
    return tuple(ys)
