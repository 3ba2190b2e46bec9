"""The TIR kernels of `topk` with a tensor k inside the VM program (`vm_dynamic.DynamicOps.topk_dyn`).

Results equal the numpy kernel's (`runtime/kernels.py`: ``argsort(-x or ~x, kind="stable")[:k]``): each row's
indices are sorted by a bottom-up merge sort that takes from the right run only where its entry comes strictly
before the left one's (stable: ties in index order), larger first for ``largest`` (numpy sorts ``-x``), NaN
after every number either way (numpy sorts NaN last); then the first k are written. O(n log n) per row, serial
(the program's kernels run on one thread anyway).
"""
from __future__ import annotations

import tvm

# ``topk_check(k[1], n) -> ok[]``: whether k is in [0, n] (else the program calls the numpy kernel back, which
# raises its own error: in Python the executor then runs the call; the C++ runner's kernel gives the same message)
_CHECK = '''# from tvm.script import tirx as T
@T.prim_func
def {name}(h_k: T.handle, n: T.int64, h_ok: T.handle):
    T.func_attr({{"tirx.noalias": True}})
    k = T.match_buffer(h_k, (T.int64(1),), "int64")
    ok = T.match_buffer(h_ok, (), "bool")
    ok[()] = T.int64(0) <= k[0] and k[0] <= n
'''

# ``topk(x[rows, n]) -> (values[rows, k], indices[rows, k], scratch[2, n])``; `st` holds the loop state:
# 0 run width, 1 source half of `s`, 2 run start, 3 left cursor, 4 right cursor, 5 output cursor, 6 mid, 7 end
_SORT = '''# from tvm.script import tirx as T
@T.prim_func
def {name}(h_x: T.handle, h_o: T.handle, h_i: T.handle, h_s: T.handle):
    T.func_attr({{"tirx.noalias": True}})
    rows = T.int64()
    n = T.int64()
    k = T.int64()
    x = T.match_buffer(h_x, (rows, n), "{dtype}")
    o = T.match_buffer(h_o, (rows, k), "{dtype}")
    ix = T.match_buffer(h_i, (rows, k), "int64")
    s = T.match_buffer(h_s, (T.int64(2), n), "int64")
    st = T.alloc_buffer((T.int64(8),), "int64")
    for r in range(rows):
        for q in range(n):
            s[0, q] = q
        st[0] = T.int64(1)
        st[1] = T.int64(0)
        while st[0] < n:
            st[2] = T.int64(0)
            while st[2] < n:
                st[6] = T.min(st[2] + st[0], n)
                st[7] = T.min(st[2] + st[0] * T.int64(2), n)
                st[3] = st[2]
                st[4] = st[6]
                st[5] = st[2]
                while st[5] < st[7]:
                    if st[3] < st[6]:
                        if st[4] < st[7]:
                            if {before}:
                                s[T.int64(1) - st[1], st[5]] = s[st[1], st[4]]
                                st[4] = st[4] + T.int64(1)
                            else:
                                s[T.int64(1) - st[1], st[5]] = s[st[1], st[3]]
                                st[3] = st[3] + T.int64(1)
                        else:
                            s[T.int64(1) - st[1], st[5]] = s[st[1], st[3]]
                            st[3] = st[3] + T.int64(1)
                    else:
                        s[T.int64(1) - st[1], st[5]] = s[st[1], st[4]]
                        st[4] = st[4] + T.int64(1)
                    st[5] = st[5] + T.int64(1)
                st[2] = st[7]
            st[1] = T.int64(1) - st[1]
            st[0] = st[0] * T.int64(2)
        for q in range(k):
            ix[r, q] = s[st[1], q]
            o[r, q] = x[r, s[st[1], q]]
'''


def _before(dtype: str, largest: bool) -> str:
    """The TIR test "the right run's entry comes strictly before the left run's" (`a` right, `b` left)."""
    a, b = "x[r, s[st[1], st[4]]]", "x[r, s[st[1], st[3]]]"
    if dtype == "bool":
        a, b = f'T.Cast("int8", {a})', f'T.Cast("int8", {b})'
    test = f"{a} > {b}" if largest else f"{a} < {b}"
    if dtype.startswith(("float", "bfloat")):
        return f"({test}) or (T.isnan({b}) and not T.isnan({a}))"
    return test


def topk_primfunc(name: str, dtype: str, largest: bool):
    from tvm.script import tirx as T  # noqa: F401 - the script's namespace
    return tvm.script.from_source(_SORT.format(name=name, dtype=dtype, before=_before(dtype, largest)))


def topk_check_primfunc(name: str):
    from tvm.script import tirx as T  # noqa: F401 - the script's namespace
    return tvm.script.from_source(_CHECK.format(name=name))
