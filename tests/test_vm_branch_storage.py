"""Region bodies copied into the branches of the VM program's ``If`` s, with storage TVM 0.27's
StaticPlanBlockMemory shares across branches (`codegen/branch_storage.py`): without that pass the path that never
allocated a shared storage died (a segfault). Each program runs in a child process of its own, so a crash fails
its test with the exit status instead of killing pytest; every path, in changing orders, at several sizes, equals
an independent numpy expression."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

# k values: the paths taken, in changing order (then / else, each case, back and forth)
KS = (3, -1, 7, 9, 3, -1, 9, 7, -1, 12)

# name -> (source of `fn(x, k)` using F, source of `want(x, k)` using np only, sizes of x (static_*: its shape))
PROGRAMS = {
    "cond_reductions": ("""
        def fn(x, k):
            return F.cond(k < 0, lambda: x * 2.0 + F.sum(x), lambda: x - F.max(x) * F.sum(x))
        """, """
        def want(x, k):
            return x * 2.0 + x.sum() if k < 0 else x - x.max() * x.sum()
        """, (1, 6, 7)),
    "case2_masks": ("""
        def fn(x, k):
            return F.case([(k < 0, lambda: F.boolean_mask(x, x > 0.0) + F.sum(x)),
                           (k < 5, lambda: F.boolean_mask(x, x < 0.0) * F.sum(x))],
                          default=lambda: x - F.sum(x))
        """, """
        def want(x, k):
            if k < 0:
                return x[x > 0] + x.sum()
            return x[x < 0] * x.sum() if k < 5 else x - x.sum()
        """, (0, 1, 6, 7)),
    "case3_masks_nonzero": ("""
        def fn(x, k):
            return F.case([(k < 0, lambda: F.boolean_mask(x, x > 0.0) * 2.0),
                           (k < 5, lambda: F.reshape(F.nonzero(x > 0.0), (-1,)).astype("float32") + F.sum(x)),
                           (k < 8, lambda: F.boolean_mask(x, x < F.mean(x)) - F.max(x))],
                          default=lambda: x + F.sum(x) * F.sum(x))
        """, """
        def want(x, k):
            if k < 0:
                return x[x > 0] * 2.0
            if k < 5:
                return np.flatnonzero(x > 0).astype(np.float32) + x.sum()
            if k < 8:
                return x[x < x.mean()] - x.max()
            return x + x.sum() * x.sum()
        """, (1, 6, 7)),
    "nested_conds": ("""
        def fn(x, k):
            return F.cond(k < 0, lambda: x + F.max(x),
                          lambda: F.cond(k < 5, lambda: x - F.mean(x),
                                         lambda: F.cond(k < 8, lambda: x * F.sum(x), lambda: x * 0.5)))
        """, """
        def want(x, k):
            if k < 0:
                return x + x.max()
            if k < 5:
                return x - x.mean()
            return x * x.sum() if k < 8 else x * 0.5
        """, (1, 6, 7)),
    "inputs_unchanged_and_tuples": ("""
        def fn(x, k):
            a, b = F.cond(k < 0, lambda: (x, F.sum(x)), lambda: (x * 2.0 + F.sum(x), F.max(x)))
            c = F.case([(k < 5, lambda: x)], default=lambda: F.boolean_mask(x, x > F.mean(x)))
            return a, b, c
        """, """
        def want(x, k):
            a, b = (x, x.sum()) if k < 0 else (x * 2.0 + x.sum(), x.max())
            c = x if k < 5 else x[x > x.mean()]
            return a, b, c
        """, (1, 6, 7)),
    "cond_in_foreach": ("""
        def fn(x, k):
            rows = F.reshape(x, (-1, 1)) + F.reshape(x, (1, -1))
            def step(row, states):
                (s,) = states
                y = F.cond(F.sum(row) > 0.0, lambda: row * 2.0 + F.sum(row), lambda: row - F.max(row))
                return y, [s + F.sum(y)]
            ys, (s,) = F.foreach(step, rows, [F.sum(x) * 0.0])
            return F.cond(k < 0, lambda: ys + s, lambda: ys - F.max(ys)), s
        """, """
        def want(x, k):
            rows = x[:, None] + x[None, :]
            ys = np.stack([r * 2.0 + r.sum() if r.sum() > 0 else r - r.max() for r in rows])
            s = ys.sum()
            return (ys + s if k < 0 else ys - ys.max()), s
        """, (1, 6, 7)),
    "cond_in_while_loop": ("""
        def fn(x, k):
            def cond(v, i):
                return i < F.abs(k)
            def body(v, i):
                v = F.cond(F.sum(v) > 0.0, lambda: v - F.max(v) * 0.5, lambda: v * 0.5 + F.sum(v) + 1.0)
                return [v, i + 1]
            v, i = F.while_loop(cond, body, [x, F.abs(k) * 0])
            return v, i
        """, """
        def want(x, k):
            v = x
            for _ in range(abs(int(k))):
                v = v - v.max() * 0.5 if v.sum() > 0 else v * 0.5 + v.sum() + 1.0
            return v, np.int64(abs(int(k)))
        """, (1, 6, 7)),
    "topk_argmax_concat_static_or_masked": ("""
        def fn(x, k):
            a = F.cond(k < 0, lambda: F.topk(x, 2)[0] * F.sum(x),
                       lambda: F.concat([F.reshape(F.argmax(x).astype("float32"), (1,)), F.reshape(F.max(x), (1,))]))
            b = F.cond(k < 5, lambda: F.full((3,), 1.0) * F.sum(x), lambda: F.boolean_mask(x, x > 0.0) + F.sum(x))
            return a, b
        """, """
        def want(x, k):
            a = np.sort(x)[::-1][:2] * x.sum() if k < 0 else np.array([np.argmax(x), x.max()], np.float32)
            b = np.full(3, x.sum(), np.float32) if k < 5 else x[x > 0] + x.sum()
            return a, b
        """, (2, 6, 7)),
    "constants_inputs_and_one_tensor_twice": ("""
        def fn(x, k):
            a = F.cond(k < 0, lambda: F.full((3,), 2.0), lambda: F.full((3,), 2.0) * F.sum(x))
            b = F.cond(k < 5, lambda: x, lambda: x + 1.0)
            def twice():
                y = x * 3.0 + F.sum(x)
                return y, y
            c, d = F.cond(k < 0, twice, lambda: (x, x * 2.0))
            return a, b, c, d
        """, """
        def want(x, k):
            a = np.full(3, 2.0, np.float32) * (1.0 if k < 0 else x.sum())
            b = x if k < 5 else x + 1.0
            c, d = (x * 3.0 + x.sum(), x * 3.0 + x.sum()) if k < 0 else (x, x * 2.0)
            return a, b, c, d
        """, (0, 1, 7)),
    "static_shapes_case": ("""
        def fn(x, k):
            m = F.reshape(x, (5, 1)) * F.reshape(x, (1, 5))
            return F.case([(k < 0, lambda: F.sum(F.exp(m) * 0.1, axis=1) + F.max(x)),
                           (k < 5, lambda: F.sum(m, axis=0) - F.mean(x)),
                           (k < 8, lambda: F.cond(F.sum(x) > 0.0, lambda: x * F.sum(m), lambda: x - F.sum(m)))],
                          default=lambda: x)
        """, """
        def want(x, k):
            m = x[:, None] * x[None, :]
            if k < 0:
                return (np.exp(m) * 0.1).sum(axis=1) + x.max()
            if k < 5:
                return m.sum(axis=0) - x.mean()
            if k < 8:
                return x * m.sum() if x.sum() > 0 else x - m.sum()
            return x
        """, (5,)),
}

CHILD = """
import sys
import numpy as np
import dyntvm as dt
from dyntvm import F
{fn}
{want}
model = dt.compile(fn, dt.TensorSpec({spec}), dt.TensorSpec((), "int64"))
assert model.vm_program, model.vm_program_fallback
rng = np.random.default_rng(7)
for k in {ks}:
    for size in {sizes}:
        x = rng.standard_normal(size).astype(np.float32)
        calls = model.vm_program_calls
        got, exp = model(x, np.int64(k)), want(x, np.int64(k))
        assert model.vm_program_calls == calls + 1, "not run by the VM program"
        got, exp = (got, exp) if isinstance(exp, tuple) else ((got,), (exp,))
        assert len(got) == len(exp)
        for g, e in zip(got, exp):
            np.testing.assert_allclose(np.asarray(g), np.asarray(e, dtype=np.asarray(g).dtype), rtol=1e-4,
                                       atol=1e-4, err_msg=f"k={{k}} size={{size}}")
print("ok", model.vm_program_calls)
"""


def _run_child(source: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DYNTVM_VM_PROGRAM="always", PYTHONPATH=os.pathsep.join(
        [HERE] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.run([sys.executable, "-c", source], capture_output=True, text=True, timeout=900, env=env,
                          check=False)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_every_path_of_a_branch_program_runs_in_the_vm(name):
    fn, want, sizes = PROGRAMS[name]
    spec = sizes if name.startswith("static") else ("N",)       # (static: every tensor of a known shape)
    r = _run_child(CHILD.format(fn=textwrap.dedent(fn), want=textwrap.dedent(want), ks=KS, sizes=sizes, spec=spec))
    crashed = " (killed by a signal: a segfault in the VM program?)" if r.returncode < 0 else ""
    assert r.returncode == 0 and "ok" in r.stdout, (
        f"{name}: exit {r.returncode}{crashed}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")


def test_the_planner_bug_and_the_pass_on_plain_relax():
    """`benchmarks/diag_branch_storage.py` (pure TVM): after the planner alone the else-branch uses the storage
    var the then-branch defines; after `scope_branch_storage` it allocates its own, and every path of the built
    function, each in a child process, equals numpy."""
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))
    try:
        import diag_branch_storage as diag
    finally:
        sys.path.pop(0)
    import tvm
    from dyntvm.codegen.branch_storage import scope_storage
    target = tvm.target.Target("llvm")
    before, _ = diag.passes(target, fixed=False)
    with target:
        planned = tvm.transform.Sequential(before + [tvm.relax.transform.StaticPlanBlockMemory()])(diag.module())
    fixed = scope_storage(planned)

    def else_storages(mod):
        (binding,) = mod["main"].body.blocks[0].bindings
        branch = binding.value.false_branch
        return sum(b.value.op.name == "relax.memory.alloc_storage" for blk in branch.blocks
                   for b in blk.bindings if isinstance(b.value, tvm.relax.Call)
                   and isinstance(b.value.op, tvm.ir.Op))
    assert else_storages(fixed) == else_storages(planned) + 1
    assert scope_storage(fixed) is fixed                    # nothing left out of scope
    assert diag.check(fixed=True) == {"1": 0, "0": 0, "10": 0, "0101": 0}
