"""TVM 0.27's StaticPlanBlockMemory across the branches of an ``If`` (pure TVM, no dyntvm model): a plain Relax
function whose branches each reduce ``x`` to a scalar (sum in one, max in the other) and add it back.

    python benchmarks/diag_branch_storage.py [--fixed] [--no-run]

Prints the function as the planner leaves it (with ``--fixed``: after dyntvm's `codegen.branch_storage` pass),
then runs each path in a child process of its own (a segfault there is reported, not fatal): then, else, then
followed by else. Without the fix the planner puts the else-branch's scalar in the storage it allocates in the
then-branch (``storage: R.Any`` with no value in the else-branch): the else path dies in
``StorageObj::AllocTensor`` (SIGSEGV), also after the then path ran (`KillAfterLastUse` cleared the register).
Exit status: 0 where every path gave the numpy result, 1 otherwise.
"""
import os
import subprocess
import sys

import numpy as np


def module():
    from tvm.script import ir as I, relax as R     # noqa: E741 - TVMScript's own names

    @I.ir_module
    class Branches:
        @R.function
        def main(x: R.Tensor(("n",), "float32"), c: R.Tensor((), "bool")):
            if c:
                s = R.sum(x)
                r = R.add(x, s)
            else:
                s2 = R.max(x)
                r = R.subtract(x, s2)
            return r
    return Branches


def passes(target, fixed: bool):
    from tvm.relax.backend.cpu_generic import pipeline as p
    finalize = p.finalize_passes(target)
    if fixed:
        from dyntvm.codegen.branch_storage import after_planning
        finalize = after_planning(finalize)
    return p.library_dispatch_passes(target) + p.legalize_passes(target) + p.dataflow_lower_passes(target), finalize


def build(fixed: bool, show: bool):
    import tvm
    target = tvm.target.Target("llvm")
    before, finalize = passes(target, fixed)
    with target:
        mod = tvm.transform.Sequential(before)(module())
        planned = tvm.transform.Sequential(finalize[:finalize.index(next(
            f for f in finalize if f.info.name == "StaticPlanBlockMemory")) + 1 + int(fixed)])(mod)
        if show:
            print(planned["main"].script(), flush=True)
        mod = tvm.transform.Sequential(finalize)(mod)
    return tvm.compile(mod, target=target, relax_pipeline=None)


def run_paths(fixed: bool, paths: str) -> None:
    """Child: run the paths ('1' then, '0' else) in order and check each against numpy."""
    import tvm
    from tvm import relax
    vm = relax.VirtualMachine(build(fixed, show=False), tvm.cpu())
    x = np.array([0.5, -2.0, 3.0, 1.0], np.float32)
    for c in paths:
        got = vm["main"](tvm.runtime.tensor(x), tvm.runtime.tensor(np.array(c == "1"))).numpy()
        want = x + x.sum() if c == "1" else x - x.max()
        np.testing.assert_allclose(got, want, rtol=1e-6)
        print(f"path {'then' if c == '1' else 'else'}: ok", flush=True)


def check(fixed: bool) -> dict:
    """Each path sequence in a child process: {paths: exit status} (-11: SIGSEGV)."""
    out = {}
    for paths in ("1", "0", "10", "0101"):
        args = [sys.executable, os.path.abspath(__file__), "--child", paths] + (["--fixed"] if fixed else [])
        r = subprocess.run(args, capture_output=True, text=True, timeout=600, check=False)
        out[paths] = r.returncode
    return out


def main(argv) -> int:
    fixed = "--fixed" in argv
    if "--child" in argv:
        run_paths(fixed, argv[argv.index("--child") + 1])
        return 0
    build(fixed, show=True)
    if "--no-run" in argv:
        return 0
    codes = check(fixed)
    for paths, rc in codes.items():
        print(f"{' -> '.join('then' if c == '1' else 'else' for c in paths):28s} exit {rc}"
              + ("  (SIGSEGV)" if rc == -11 else ""))
    return 0 if all(rc == 0 for rc in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
