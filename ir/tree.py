"""Flatten nested lists/tuples/dicts of leaves and rebuild them. Specs are JSON-friendly."""
from __future__ import annotations

LEAF = "*"


def tree_flatten(obj, is_leaf=None) -> tuple[list, object]:
    leaves: list = []

    def go(o):
        if is_leaf is not None and is_leaf(o):
            leaves.append(o)
            return LEAF
        if isinstance(o, (list, tuple)):
            return ["list" if isinstance(o, list) else "tuple", [go(x) for x in o]]
        if isinstance(o, dict):
            keys = list(o)
            if not all(isinstance(k, str) for k in keys):
                raise TypeError("only dicts with string keys can be inputs or outputs")
            return ["dict", keys, [go(o[k]) for k in keys]]
        leaves.append(o)
        return LEAF
    return leaves, go(obj)


def flatten_like(spec, arg, leaves: list) -> bool:
    """Append the leaves of `arg` nested like `spec` (the traced signature); False where it is nested
    otherwise. A leaf position takes the whole object: a nested list there is one array, as numpy reads it."""
    if spec == LEAF:
        leaves.append(arg)
        return True
    if spec[0] == "dict":
        if not isinstance(arg, dict) or set(arg) != set(spec[1]):
            return False
        return all(flatten_like(c, arg[k], leaves) for k, c in zip(spec[1], spec[2]))
    if not isinstance(arg, list if spec[0] == "list" else tuple) or len(arg) != len(spec[1]):
        return False
    return all(flatten_like(c, a, leaves) for c, a in zip(spec[1], arg))


def tree_unflatten(spec, leaves) -> object:
    it = iter(leaves)

    def go(s):
        if s == LEAF:
            return next(it)
        if s[0] == "dict":
            return {k: go(c) for k, c in zip(s[1], s[2])}
        items = [go(c) for c in s[1]]
        return items if s[0] == "list" else tuple(items)
    return go(spec)


def tree_str(spec) -> str:
    if spec == LEAF:
        return "*"
    if spec[0] == "dict":
        return "{" + ", ".join(f"{k}: {tree_str(c)}" for k, c in zip(spec[1], spec[2])) + "}"
    inner = ", ".join(tree_str(c) for c in spec[1])
    return f"[{inner}]" if spec[0] == "list" else f"({inner}{',' if len(spec[1]) == 1 else ''})"


def num_leaves(spec) -> int:
    if spec == LEAF:
        return 1
    return sum(num_leaves(c) for c in spec[-1])
