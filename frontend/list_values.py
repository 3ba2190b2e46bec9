"""What a list of tensors is in the frontend: `TensorList` while tracing (a proxy of a list value, like
`Tensor` for tensors), `ArrayList` eagerly (a Python list of numpy arrays that also knows its `ListType`), and
`ListSpec` (in `tracer.py`, next to `TensorSpec`) the spec of a list input of `dt.trace`. Both value kinds are one leaf for the tree of a function's
arguments and results (a Python list there is a nesting of several values). The list ops are in `lists.py`."""
from __future__ import annotations

from dyntvm.errors import TraceError

from ..ir.list_type import ListType
from ..ir.types import user_line


class TensorList:
    """A traced list of tensors (`F.make_list`, `F.list_empty`, a list input). Its length and elements are known
    when the model runs: use `F.list_length`, `F.list_at`, `F.list_stack` (Python's `len`, indexing and
    iteration would need them while tracing)."""

    __slots__ = ("value", "builder")

    def __init__(self, value, builder):
        self.value, self.builder = value, builder

    @property
    def type(self) -> ListType:
        return self.value.type

    @property
    def dtype(self):
        import numpy as np
        return np.dtype(self.value.type.dtype)

    def __repr__(self):
        return f"TensorList({self.value.type})"

    def _no(self, what, hint):
        where = user_line()
        raise TraceError(f"{what} of a traced list {self.type} is not known while tracing; {hint}"
                         + (f"\n    at {where}" if where else ""))

    def __len__(self):
        self._no("len()", "use F.list_length(lst) (an int64 tensor)")

    def __iter__(self):
        self._no("iteration", "use F.list_at(lst, i) in F.while_loop, or F.list_stack(lst)")

    def __getitem__(self, i):
        self._no("indexing", "use F.list_at(lst, i) (i an int or an integer tensor)")

    def __bool__(self):
        self._no("bool()", "compare F.list_length(lst) in F.cond / F.while_loop")

    def __hash__(self):
        return id(self)


class ArrayList(list):
    """An eager list of tensors: a Python list of numpy arrays, with the `ListType` the same calls give while
    tracing (so eager and traced calls accept the same programs, an empty list included)."""

    __slots__ = ("type",)

    def __init__(self, items, type: ListType):
        super().__init__(items)
        self.type = type

    @property
    def dtype(self):
        import numpy as np
        return np.dtype(self.type.dtype)
