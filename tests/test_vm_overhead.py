"""What a plain call through the VM program leaves to Python (issue 25's per-call overhead): a region's size check
runs in the program (`codegen/vm_guard.py`) and calls the runtime's check back only for values that may be
large, where that check still raises its MemoryError (as the executor's ExecutionError)."""
import re

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F, examples
from dyntvm.errors import ExecutionError
from dyntvm.examples.plain_numpy import BY_EXAMPLE
from dyntvm.ir.vm_program import python_callbacks
from helpers import assert_same, vm_calls  # tests/ is on sys.path


@pytest.fixture
def count_guards(monkeypatch):
    """A list that gets one entry (the key) per size check the programs call back into Python from now on."""
    from dyntvm.runtime import vm_program
    calls: list = []

    class Counting(dict):
        def __getitem__(self, key):
            check = dict.__getitem__(self, key)
            return lambda args: calls.append(key) or check(args)
    monkeypatch.setattr(vm_program, "_guards", Counting(vm_program._guards))
    return calls


@pytest.mark.parametrize("name, sizes", [("branchy", ({"B": 1}, {"B": 16, "shift": 1.0}, {"B": 4, "shift": -1.0},
                                                      {"B": 8, "scale": 0.05})),
                                         ("detection", ({"N": 0}, {"N": 1, "keep_fraction": 1.0}, {"N": 200}))])
def test_size_checks_of_small_regions_stay_in_the_program(count_guards, monkeypatch, name, sizes):
    """branchy and detection have regions whose sizes the runtime checks (else this tests nothing); at their
    sizes the program's own evaluation passes them, and no check is called back. Results equal plain numpy."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")
    ex = examples.get(name)
    model = dt.compile(ex.fn, *ex.specs)
    assert model.vm_program, model.vm_program_fallback
    assert "region" in [n.op for n in python_callbacks(model.graph)]
    if name == "detection":         # one mask for three boolean_masks and a nonzero: counted once
        main = [f for f in model.lib.as_text().split("\n@") if f.startswith("dyntvm_main:")][0]
        assert main.count("call  dyntvm_vm_count_bool") == 1, main
    for i, s in enumerate(sizes):
        inputs = ex.make_inputs(np.random.default_rng(i), **s)
        calls = model.vm_program_calls
        assert_same(model(*inputs), BY_EXAMPLE[name](*inputs), rtol=1e-4, atol=1e-4, what=str(s))
        assert model.vm_program_calls == calls + 1
    assert count_guards == []


def test_a_region_too_large_for_memory_is_checked_by_the_runtime(count_guards, monkeypatch):
    """An outer product of two vectors of 2**17 and 2**19 rows would be 2**38 bytes: the program calls the
    runtime's check (the counted callback), whose MemoryError fails the program; the executor then raises its
    ExecutionError naming the value, and nothing was allocated. Just under the program's own bound, no check
    is called back and the result is right."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")

    def fn(a, b):
        return F.matmul(F.reshape(a, (-1, 1)), F.reshape(b, (1, -1))) + 1.0

    model = dt.compile(fn, dt.TensorSpec(("N",)), dt.TensorSpec(("M",)))
    assert model.vm_program, model.vm_program_fallback
    a, b = np.ones(1 << 17, np.float32), np.ones(1 << 19, np.float32)
    with pytest.raises(ExecutionError, match="more than this machine's memory"):
        model(a, b)
    assert len(count_guards) == 1
    a, b = np.arange(3, dtype=np.float32), np.arange(5, dtype=np.float32)
    assert_same(model(a, b), np.outer(a, b) + 1.0)
    assert len(count_guards) == 1


def _misaligned(a: np.ndarray) -> np.ndarray:
    """A copy of `a` whose data starts 16 bytes past a 64-byte boundary (numpy's own alignment is 16)."""
    raw = np.empty(a.nbytes + 128, np.uint8)
    off = (-raw.ctypes.data) % 64 + 16
    out = raw[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


def test_kept_input_buffers_never_leak_into_results(monkeypatch):
    """Misaligned inputs are copied into buffers kept between calls (`runtime/tensors.InputStaging`). An output
    that is the input itself or a view of it keeps its values after later calls (its buffer is not reused);
    the other buffers are (the same address call after call); new shapes get new buffers. Built with kernels that
    assume 64-byte alignment (`vm_program.ELEMENT_ALIGNED_INPUTS` off: with it, nothing is copied)."""
    from dyntvm.codegen import vm_program
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")
    monkeypatch.setattr(vm_program, "ELEMENT_ALIGNED_INPUTS", False)

    def fn(x, y):
        return x, F.reshape(x, (-1,)), y * 2.0

    model = dt.compile(fn, dt.TensorSpec(("N", 3)), dt.TensorSpec(("M",)))
    assert model.vm_program, model.vm_program_fallback
    assert not model._threads.executor.program.staging.element_aligned
    rng = np.random.default_rng(0)
    kept = []
    for n in (4, 4, 4, 1, 4):
        x, y = _misaligned(rng.random((n, 3), np.float32)), _misaligned(rng.random(5, np.float32))
        calls = model.vm_program_calls
        got = model(x, y)
        assert model.vm_program_calls == calls + 1
        assert_same(got, (x, x.reshape(-1), y * 2.0))
        kept.append((x.copy(), got))
    for x, got in kept:                  # earlier results untouched by later calls
        assert_same(got[0], x)
        assert_same(got[1], x.reshape(-1))
    staging = model._threads.executor.program.staging
    assert staging.bufs[0] is None       # x's buffer went out as a result
    y_address = staging.bufs[1].ctypes.data          # (holding the buffer here would keep it from reuse)
    model(_misaligned(np.ones((2, 3), np.float32)), _misaligned(np.ones(5, np.float32)))
    assert staging.bufs[1].ctypes.data == y_address  # reused: nothing outside held it


def test_region_bodies_are_copied_into_the_program(monkeypatch):
    """The program's own sequence holds its regions' bodies, not calls of their functions (the executor still
    calls those; regions inside a loop function stay calls; a branch of the program's own sequence copies them
    too): detection N=200 executes at most 130 VM instructions per call (127; 145 with its mask's count read from
    a tensor and a make_shape per use of a shape, 245 with calls, a counter output per mask kernel and views to
    the same shape; 168 with each region's inputs matched again), branchy at most 86 at B=1 and B=16 (85; 88 with
    a make_shape per use of a shape, 113 with its branches' regions called, 119 with its inputs matched again,
    1185 at B=16 with a foreach over rows); results equal plain numpy.
    The copying is on by default (`vm_program.INLINE_REGIONS`; detection executed 213 instructions per call with
    its two regions called); built here with use_cache=False (the switch is not part of the cache key)."""
    from dyntvm.codegen import vm_program
    assert vm_program.INLINE_REGIONS
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")
    for name, sizes, most in (("detection", {"N": 200}, 130), ("branchy", {"B": 1}, 86),
                              ("branchy", {"B": 16}, 86)):
        ex = examples.get(name)
        model = dt.compile(ex.fn, *ex.specs, use_cache=False)
        assert model.vm_program, model.vm_program_fallback
        main = [f for f in model.lib.as_text().split("\n@") if f.startswith("dyntvm_main:")][0]
        assert not re.search(rf"call  {name}_\w*r\d+ ", main), main      # (its branches' regions too)
        inputs = ex.make_inputs(np.random.default_rng(1), **sizes)
        assert vm_calls(model, inputs) <= most
        assert_same(model(*inputs), BY_EXAMPLE[name](*inputs), rtol=1e-4, atol=1e-4, what=f"{name} {sizes}")
        assert model.regions and model.vm[model.regions[0]]      # the executor's functions are still there


def test_a_program_that_fails_to_build_with_copied_bodies_is_built_with_calls(monkeypatch):
    """Where the program with the regions' bodies copied in fails to build (as VMShapeLower did for a jvp of a
    foreach and three torchvision detectors), it is built again with the regions called: the model still runs as
    one VM call, equal to plain numpy, its program calling `detection_r0`."""
    from dyntvm.codegen import vm_program
    from dyntvm.codegen.backends.cpu import cpu_schedule
    real_add, real_build = vm_program.add_program, cpu_schedule.build_cpu
    tried: list = []

    def add_program(mod, graph, prefix, inline=False):
        tried.append(inline)
        return real_add(mod, graph, prefix, inline)

    def build_cpu(mod, target=None, loops=(), tuned=None, program=None):
        ex = real_build(mod, target, loops, tuned=tuned, program=program)
        if program is not None and tried and tried[-1]:
            raise RuntimeError("PrimExpr T_1 has not been computed (simulated)")
        return ex
    monkeypatch.setattr(vm_program, "add_program", add_program)
    monkeypatch.setattr(cpu_schedule, "build_cpu", build_cpu)
    retries = len(vm_program.stats.inline_retries)
    ex = examples.get("detection")
    model = dt.compile(ex.fn, *ex.specs, use_cache=False)
    assert tried == [True, False] and len(vm_program.stats.inline_retries) == retries + 1
    assert model.vm_program, model.vm_program_fallback
    main = [f for f in model.lib.as_text().split("\n@") if f.startswith("dyntvm_main:")][0]
    assert "call  detection_r0 " in main, main
    inputs = ex.make_inputs(np.random.default_rng(2), N=37)
    assert_same(model(*inputs), BY_EXAMPLE["detection"](*inputs), rtol=1e-4, atol=1e-4, what="detection N=37")
    assert model.vm_program_calls == 1


def _chain_links(make, link, x) -> float:
    """VM instructions per link of a chain of `make(n)` links (n = 1 and 9), results equal to plain numpy's
    `link` applied n times; compiled with the program forced on."""
    counts = []
    for n in (1, 9):
        model = dt.compile(make(n), dt.TensorSpec(("N",)))
        assert model.vm_program, model.vm_program_fallback
        counts.append(vm_calls(model, [x]))
        for size in (0, 1, 7):
            v = np.linspace(-1.0, 2.0, size).astype(np.float32)
            want = v
            for _ in range(n):
                want = link(want)
            np.testing.assert_allclose(model(v), want, rtol=1e-6)
    return (counts[1] - counts[0]) / 8


def test_a_cond_or_a_mask_costs_few_vm_instructions(monkeypatch):
    """Per link of a chain (`benchmarks/bench_vm_nodes.py`): a cond whose branches are one region each (its
    predicate a region) executes at most 16 VM instructions (25 with the branch regions called, each a function
    of its own; 27 with its input matched again for the predicate),
    a boolean_mask with its comparison at most 15 (23 with the count written to a tensor read as a shape and a
    make_shape per use of a shape, 36 with the 1-d data viewed as rows and back, and its shape matched again for
    the region and the mask)."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")

    def cond_chain(n):
        def fn(x):
            for _ in range(n):
                x = F.cond(F.sum(x) > 0, lambda v=x: v + 1.0, lambda v=x: v - 1.0)
            return x
        return fn

    def mask_chain(n):
        def fn(x):
            for _ in range(n):
                x = F.boolean_mask(x, x > -0.5)
            return x
        return fn
    x = np.linspace(0.5, 2.0, 4).astype(np.float32)
    assert _chain_links(cond_chain, lambda v: v + 1.0 if v.sum() > 0 else v - 1.0, x) <= 16
    assert _chain_links(mask_chain, lambda v: v[v > -0.5], x) <= 15


def test_a_region_on_values_of_known_shape_matches_nothing_again(monkeypatch):
    """`x`'s mask is counted once; both masked values have the count's shape, so the region adding them binds its
    dims from it: the program matches a shape twice (`x`, `y` against `x`'s length) and stores the count (the
    count kernel's result, `vm_dynamic.COUNT_RETURNED`) once, not five shapes (the count read from a tensor, the
    region's two inputs again). Results equal numpy at N = 0, 1, 5."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")

    def fn(x, y):
        keep = x > 0
        return F.boolean_mask(x, keep) * 2.0 + F.boolean_mask(y, keep)
    model = dt.compile(fn, dt.TensorSpec(("N",)), dt.TensorSpec(("N",)))
    assert model.vm_program, model.vm_program_fallback
    main = [f for f in model.lib.as_text().split("\n@") if f.startswith("dyntvm_main:")][0]
    assert main.count("vm.builtin.match_shape") == 2, main
    assert main.count("vm.builtin.match_prim_value") == 1, main
    assert "tensor_to_shape" not in main, main
    rng = np.random.default_rng(3)
    for size in (0, 1, 5):
        x, y = rng.standard_normal(size).astype(np.float32), rng.standard_normal(size).astype(np.float32)
        np.testing.assert_allclose(model(x, y), x[x > 0] * 2.0 + y[x > 0], rtol=1e-6)


def test_branches_with_static_shape_tensors_run_every_path(monkeypatch):
    """Regions copied into the branches of ``If`` s: TVM 0.27's StaticPlanBlockMemory gave a static-shape tensor
    (a sum's scalar) of one branch the storage it allocated in the other branch, which that path never
    allocates, and the process died (a segfault) - a cond with a reduction in both branches, a case of two
    predicates, nested conds - until `codegen.branch_storage` allocated such storage again where it is used.
    Every path, in changing order, equals plain numpy (more, each in a child process:
    `tests/test_vm_branch_storage.py`)."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")

    def both(x, k):
        return F.cond(k < 0, lambda: x * 2.0 + F.sum(x), lambda: x - F.max(x) * F.sum(x))

    def case(x, k):
        return F.case([(k < 0, lambda: x * 2.0 + F.sum(x)), (k < 5, lambda: x + F.sum(x))],
                      default=lambda: x - F.sum(x))

    def nested(x, k):
        return F.cond(k < 0, lambda: x + F.max(x), lambda: F.cond(k < 5, lambda: x - F.mean(x), lambda: x * 0.5))

    numpy = {both: lambda x, k: x * 2 + x.sum() if k < 0 else x - x.max() * x.sum(),
             case: lambda x, k: x * 2 + x.sum() if k < 0 else x + x.sum() if k < 5 else x - x.sum(),
             nested: lambda x, k: x + x.max() if k < 0 else x - x.mean() if k < 5 else x * 0.5}
    rng = np.random.default_rng(4)
    for fn in (both, case, nested):
        model = dt.compile(fn, dt.TensorSpec(("N",)), dt.TensorSpec((), "int64"))
        assert model.vm_program, model.vm_program_fallback
        for k in (3, -1, 7, 3, 7, -1):
            for size in (1, 6):
                x = rng.standard_normal(size).astype(np.float32)
                np.testing.assert_allclose(model(x, np.int64(k)), numpy[fn](x, k), rtol=1e-5, atol=1e-6)


def test_a_while_loop_passing_its_var_through_keeps_the_program(monkeypatch):
    """A while_loop without a compiled loop (a cond with a mask in its body) whose per-step output is a loop var
    itself: the program's match of that var to a shape, made in the step's own sequence, is not reused by the
    condition emitted around it (a variable used out of its scope failed the build and the model ran in the
    executor). One program call per model call, equal to a plain numpy loop at 0, 1 and several iterations."""
    monkeypatch.setenv("DYNTVM_VM_PROGRAM", "always")

    def fn(x, n):
        def cond(v, i):
            return F.logical_and(F.max(v) < 100.0, i < n)        # (F.max: the condition stays out of the body)

        def body(v, i):
            j = F.cond(F.max(v) > 0.0, lambda: i + F.sum(F.boolean_mask(v, v > 0)).astype("int64"),
                       lambda: i + 1)
            return v, [v * 1.5, j]                               # (a per-step output: the loop var itself)
        ys, (v, i) = F.while_loop(cond, body, [x, np.int64(0)])
        return ys, v, i
    def numpy_fn(x, n):
        v, i, ys = x, 0, []
        while v.max() < 100.0 and i < n:
            j = i + int(v[v > 0].sum()) if v.max() > 0.0 else i + 1
            ys.append(v)
            v, i = v * 1.5, j
        return np.array(ys, np.float32).reshape(-1, 3), v, np.int64(i)
    model = dt.compile(fn, dt.TensorSpec((3,)), dt.TensorSpec((), "int64"))
    assert model.vm_program, model.vm_program_fallback
    for start, n in ((1.0, 4), (1.0, 0), (-3.0, 1), (200.0, 5), (2.0, 40)):
        x = np.array([start, 0.5, -1.0], np.float32)
        calls = model.vm_program_calls
        got, want = model(x, np.int64(n)), numpy_fn(x, n)
        assert model.vm_program_calls == calls + 1
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5)
