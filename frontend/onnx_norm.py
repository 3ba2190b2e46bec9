"""The ONNX converters of the norms and contractions, written with `dyntvm.F` ops: ReduceL1, ReduceL2,
ReduceSumSquare, ReduceLogSum, ReduceLogSumExp, LpNormalization, InstanceNormalization, GroupNormalization and
Einsum; registered into `onnx_ops.CONVERTERS` like the others."""
from __future__ import annotations

import re

import numpy as np

from ..ir.types import is_static_dim, same_dim
from . import F
from .onnx_ops import OnnxImportError, _axes, _c, _rank, _shape, converter


def _reduce_axes(ins, a, node):
    """The reduced axes (None: all), or "noop" where an empty axes list means none (noop_with_empty_axes)."""
    axes = _axes(ins, a, node)
    if not axes:
        return "noop" if a.get("noop_with_empty_axes", 0) else None
    return tuple(int(ax) for ax in axes)


@converter("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")
def _reduce_norm(ins, a, ctx, env, node):
    x, op = ins[0], node.op_type
    axes = _reduce_axes(ins, a, node)
    keep = bool(a.get("keepdims", 1))
    if axes == "noop":          # ONNX's reference: the elementwise part only
        axes, keep = (), True
    if op == "ReduceLogSumExp":
        return _logsumexp(x, axes, keep)
    term = F.abs(x) if op == "ReduceL1" else x * x if op in ("ReduceL2", "ReduceSumSquare") else x
    if axes == ():
        s = term
    else:
        s = F.sum(term, axis=axes, keepdims=keep)
        s = s if s.dtype == x.dtype else F.astype(s, np.dtype(x.dtype).name)
    if op == "ReduceL2":
        return _same_dtype(F.sqrt(s), x)
    if op == "ReduceLogSum":
        return _same_dtype(F.log(s), x)
    return s


def _same_dtype(y, x):
    return y if y.dtype == x.dtype else F.astype(y, np.dtype(x.dtype).name)


def _logsumexp(x, axes, keep):
    """log(sum(exp(x))) computed as m + log(sum(exp(x - m))), m the maximum (0 where it is infinite), so large
    entries do not overflow; an axis that is statically empty sums to 0 (log: -inf) without a maximum."""
    if axes == ():
        return x
    r = _rank(x)
    reduced = range(r) if axes is None else [ax % r for ax in axes]
    if any(is_static_dim(_shape(x)[ax], 0) for ax in reduced):
        return _same_dtype(F.log(F.sum(F.exp(x), axis=axes, keepdims=keep)), x)
    if any(not isinstance(_shape(x)[ax], (int, np.integer)) for ax in reduced):
        # a symbolic axis may be empty when it runs: the maximum of x with one -inf more on each reduced axis
        # exists (-inf, then shifted by 0) and equals x's where x has entries
        width = tuple((0, 1) if k in reduced else (0, 0) for k in range(r))
        m = F.max(F.pad(x, width, float("-inf")), axis=axes, keepdims=True)
    else:
        m = F.max(x, axis=axes, keepdims=True)
    m = F.where(F.isnan(m - m), _c(0, m), m)            # +-inf (and NaN) maxima: shift by 0
    s = F.log(F.sum(F.exp(x - m), axis=axes, keepdims=True)) + m
    s = s if keep else F.squeeze(s, tuple(range(r)) if axes is None else tuple(ax % r for ax in axes))
    return _same_dtype(s, x)


@converter("LpNormalization")
def _lp_normalization(ins, a, ctx, env, node):
    x = ins[0]
    p, axis = int(a.get("p", 2)), int(a.get("axis", -1))
    if p not in (1, 2):
        raise OnnxImportError(f"LpNormalization: p must be 1 or 2, got {p}")
    norm = F.sum(F.abs(x), axis=axis, keepdims=True) if p == 1 else F.sqrt(F.sum(x * x, axis=axis, keepdims=True))
    norm = _same_dtype(norm, x)
    return x / F.where(F.equal(norm, _c(0, norm)), _c(1, norm), norm)       # a zero vector stays zero (onnxruntime)


def _normalize(x, axes, eps):
    """(x - mean) / sqrt(var + eps) over `axes`, the statistics in float32 at least."""
    ct = "float64" if np.dtype(x.dtype) == np.float64 else "float32"
    xc = F.astype(x, ct) if np.dtype(x.dtype).name != ct else x
    d = xc - F.mean(xc, axis=axes, keepdims=True)
    y = d * F.rsqrt(F.mean(d * d, axis=axes, keepdims=True) + np.asarray(eps, ct))
    return _same_dtype(y, x)


def _nc_data(ins, node):
    """(x, scale, bias) of a normalization over N, C, spatial... data."""
    x = ins[0]
    if _rank(x) < 3:
        raise OnnxImportError(f"{node.op_type} needs data of rank 3 or more (N, C, spatial...), got rank {_rank(x)}")
    return tuple(ins[:3])


@converter("InstanceNormalization")
def _instance_norm(ins, a, ctx, env, node):
    x, scale, bias = _nc_data(ins, node)
    per_channel = (-1,) + (1,) * (_rank(x) - 2)
    y = _normalize(x, tuple(range(2, _rank(x))), a.get("epsilon", 1e-5))
    return y * F.reshape(scale, per_channel) + F.reshape(bias, per_channel)


@converter("GroupNormalization")
def _group_norm(ins, a, ctx, env, node):
    x, scale, bias = _nc_data(ins, node)
    if "num_groups" not in a:
        raise OnnxImportError("GroupNormalization: the num_groups attribute is required")
    g, c = int(a["num_groups"]), _shape(x)[1]
    if not isinstance(c, (int, np.integer)) or g < 1 or c % g:
        raise OnnxImportError(f"GroupNormalization: {c} channels (a static count is needed) do not split into "
                              f"{g} groups")
    n_scale = _shape(scale)[0]
    if not any(same_dim(n_scale, v) for v in (c, g)):
        raise OnnxImportError(f"GroupNormalization: scale of {n_scale} entries, expected {c} (per channel) or {g} "
                              "(per group, opset 18)")
    grouped = F.reshape(x, (_shape(x)[0], g, c // g) + tuple(_shape(x)[2:]))
    y = F.reshape(_normalize(grouped, tuple(range(2, _rank(x) + 1)), a.get("epsilon", 1e-5)), _shape(x))
    if n_scale == g and g != c:          # opset 18: one scale and bias per group
        scale, bias = (F.reshape(F.tile(F.reshape(v, (g, 1)), (1, c // g)), (c,)) for v in (scale, bias))
    per_channel = (-1,) + (1,) * (_rank(x) - 2)
    return y * F.reshape(scale, per_channel) + F.reshape(bias, per_channel)


# ------------------------------------------------------------------------------------------------- Einsum
def _parse_einsum(eq: str, ranks: list, node) -> tuple:
    """(the letters of each operand, the output's letters), an ellipsis expanded to upper-case letters (one per
    broadcast axis, right-aligned as numpy's), the output implicit where there is no '->'."""
    eq = eq.replace(" ", "")
    if not re.fullmatch(r"[a-zA-Z.,]*(->[a-zA-Z.]*)?", eq):
        raise OnnxImportError(f"Einsum: malformed equation {eq!r}")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise OnnxImportError(f"Einsum: the equation {eq!r} names {len(terms)} operands, the node has {len(ranks)}")
    if any(ch.isupper() for ch in eq):
        raise OnnxImportError(f"Einsum: upper-case subscripts in {eq!r} are not supported")
    n_ell = 0
    for t, r in zip(terms, ranks):
        if "..." in t:
            n_ell = max(n_ell, r - len(t.replace("...", "")))
    ell = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[:n_ell]
    out_terms = []
    for t, r in zip(terms, ranks):
        if t.count("...") > 1 or "." in t.replace("...", ""):
            raise OnnxImportError(f"Einsum: malformed ellipsis in {eq!r}")
        if "..." in t:
            k = r - len(t.replace("...", ""))
            if k < 0:
                raise OnnxImportError(f"Einsum: term {t!r} has more subscripts than its operand's rank {r}")
            t = t.replace("...", ell[n_ell - k:])
        if len(t) != r:
            raise OnnxImportError(f"Einsum: term {t!r} of {eq!r} has {len(t)} subscripts for an operand of rank {r}")
        out_terms.append(t)
    if _ == "":
        counts = {ch: "".join(out_terms).count(ch) for ch in "".join(out_terms)}
        rhs = ell + "".join(sorted(ch for ch, n in counts.items() if n == 1 and ch.islower()))
    else:
        if ell and "..." not in rhs:        # numpy's rule (ONNX's reference): the broadcast axes are not summed
            raise OnnxImportError(f"Einsum: the operands of {eq!r} have {n_ell} axes under '...' but the output "
                                  "has no '...' to keep them")
        rhs = rhs.replace("...", ell)
        if "." in rhs or len(set(rhs)) != len(rhs) or not set(rhs) <= set("".join(out_terms)):
            raise OnnxImportError(f"Einsum: output subscripts {rhs!r} of {eq!r} repeat or are not on the left")
    return out_terms, rhs


def _diagonal(x, letters: str):
    """Operand x with each repeated letter reduced to one axis (its diagonal)."""
    while len(set(letters)) != len(letters):
        ch = next(c for c in letters if letters.count(c) > 1)
        i = letters.index(ch)
        j = letters.index(ch, i + 1)
        n, m = _shape(x)[i], _shape(x)[j]
        eye = F.equal(F.reshape(F.arange(0, n), tuple(n if k == i else 1 for k in range(len(letters)))),
                      F.reshape(F.arange(0, m), tuple(m if k == j else 1 for k in range(len(letters)))))
        x = _same_dtype(F.sum(F.where(eye, x, _c(0, x)), axis=j), x)
        letters = letters[:j] + letters[j + 1:]
    return x, letters


def _align(x, letters: str, target: str):
    """x with its axes ordered as `target` (a superset of its letters), size-1 axes for the letters it lacks."""
    order = [letters.index(ch) for ch in target if ch in letters]
    if order != sorted(order):
        x = F.transpose(x, tuple(order))
    for k, ch in enumerate(target):
        if ch not in letters:
            x = F.expand_dims(x, k)
    return x


@converter("Einsum")
def _einsum(ins, a, ctx, env, node):
    eq = a.get("equation", b"")
    eq = eq.decode() if isinstance(eq, bytes) else str(eq)
    terms, out = _parse_einsum(eq, [_rank(x) for x in ins], node)
    dtype = np.dtype(ins[0].dtype)
    ops = []
    for k, (x, t) in enumerate(zip(ins, terms)):
        x, t = _diagonal(x, t)
        others = out + "".join(terms[:k] + terms[k + 1:])
        own = tuple(i for i, ch in enumerate(t) if ch not in others)     # summed out here already
        if own:
            x = _same_dtype(F.sum(x, axis=own), x)
            t = "".join(ch for i, ch in enumerate(t) if i not in own)
        ops.append((x, t))
    x, t = ops[0]
    for k, (y, u) in enumerate(ops[1:], start=1):
        later = out + "".join(v for _, v in ops[k + 1:])
        x, t = _contract(x, t, y, u, later)
    x = _same_dtype(x, np.zeros((), dtype))
    return _align(x, t, out) if t != out else x


def _contract(x, t: str, y, u: str, keep: str):
    """The product of two operands summed over the letters they share that `keep` does not name: a matmul
    (batch: shared kept letters; at most one letter of x's own, of y's own and summed each) where it fits,
    else a broadcast product summed."""
    shared = [ch for ch in t if ch in u]
    batch = [ch for ch in shared if ch in keep]
    summed = [ch for ch in shared if ch not in keep]
    xo = [ch for ch in t if ch not in u]
    yo = [ch for ch in u if ch not in t]
    if len(xo) <= 1 and len(yo) <= 1 and len(summed) <= 1 and _rank(x) and _rank(y):
        mi, ki, ni = (xo or ["1"]), (summed or ["2"]), (yo or ["3"])
        xm = _align(x, t, "".join(batch) + mi[0] + ki[0])         # [batch, m, k]: placeholders are size-1 axes
        ym = _align(y, u, "".join(batch) + ki[0] + ni[0])
        r = F.matmul(xm, ym)
        letters = "".join(batch) + mi[0] + ni[0]
        drop = tuple(i for i, ch in enumerate(letters) if ch in "13")
        if drop:
            r = F.squeeze(r, drop)
            letters = "".join(ch for ch in letters if ch not in "13")
        return r, letters
    union = "".join(dict.fromkeys(t + u))
    p = _align(x, t, union) * _align(y, u, union)
    axes = tuple(i for i, ch in enumerate(union) if ch in summed)
    if axes:
        p = F.sum(p, axis=axes)
    return p, "".join(ch for ch in union if ch not in summed)
