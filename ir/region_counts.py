"""Which values of a region could exceed memory at sizes known only when it runs (`runtime/region_sizes.py`
checks them before each call; the VM program asks the runtime to, `ir/vm_program.py`).

A value provably no larger than the region's inputs together plus `SLACK_BYTES` needs no check: its inputs
already exist, so it amplifies nothing."""
from __future__ import annotations

import numpy as np

from .dims import parse_dim
from .graph import Node
from .types import TensorType, dim_add, dim_compare, dim_mul

#: bytes a region may make beyond its inputs' own bytes with no check (a few appended rows, small static tables)
SLACK_BYTES = 1 << 20


def _count(shape) -> object:
    n = 1
    for d in shape:
        n = dim_mul(n, d)
    return n


def amplified_counts(region: Node) -> list:
    """``(element count (parsed dim), item size, an example type)`` of the largest values of `region` that are
    neither static nor provably within its inputs' bytes (none of them provably as large as another); empty
    where no value needs a check."""
    sub = region.subgraphs[0]
    tensors = [v.type for v in sub.inputs if isinstance(v.type, TensorType)]
    held = {_count(t.shape) for t in tensors}
    bound: object = SLACK_BYTES         # the inputs' bytes together, plus the slack: what cannot amplify
    for t in tensors:
        bound = dim_add(bound, dim_mul(_count(t.shape), np.dtype(t.dtype).itemsize))
    made: dict = {}                     # element count -> (largest item size, an example shape and dtype)
    for m in sub.nodes:
        for v in m.outputs:
            t = v.type
            if not isinstance(t, TensorType) or all(isinstance(d, int) for d in t.shape):
                continue                # static: checked when traced
            n, size = _count(t.shape), np.dtype(t.dtype).itemsize
            if n in held or dim_compare(dim_mul(n, size), "<=", bound):
                continue
            if size > made.get(n, (0,))[0]:
                made[n] = (size, t)
    largest: list = []                  # (bytes, count, size, type): those no other is provably as large as
    for n, (size, t) in made.items():
        nbytes = dim_mul(n, size)
        if any(dim_compare(nbytes, "<=", other[0]) for other in largest):
            continue
        largest = [o for o in largest if not dim_compare(o[0], "<=", nbytes)] + [(nbytes, n, size, t)]
    return [(parse_dim(n), size, t) for _, n, size, t in largest]     # parsed once
