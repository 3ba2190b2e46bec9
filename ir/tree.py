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
