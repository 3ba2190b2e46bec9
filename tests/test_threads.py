"""One model called from 8 threads at once gives the serial results: a plain region model, a loop model
(foreach and while_loop with a boolean_mask inside) and a loaded artifact. Threads start together (a
barrier) and make a bounded number of calls each, on inputs of different sizes."""
import threading

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

from helpers import assert_same

# these tests count the executor's region calls (`model.kernel_calls`): models run in the executor
pytestmark = pytest.mark.usefixtures("executor_only")

THREADS = 8
SIZES = (0, 1, 2, 5, 17, 64, 257)
_rng = np.random.default_rng(0)
W = (_rng.standard_normal((8, 8)) * 0.5).astype(np.float32)


def plain(x):
    return F.tanh(x) * 2.0 + 1.0


def loops(xs, h):
    def step(x, states):
        (h,) = states
        y = F.tanh(F.matmul(x, W) + h)
        return F.sum(F.boolean_mask(y, y > 0)), [h + y * 0.5]
    sums, (h,) = F.foreach(step, xs, [h])

    def body(v):
        return F.sum(F.boolean_mask(v, F.abs(v) > 0.25)), [v * 0.5]
    kept, (v,) = F.while_loop(lambda v: F.sum(F.abs(v)) > 0.5, body, [h], max_iterations=64)
    return sums, h, kept, v


def plain_inputs(n, seed):
    return (np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32),)


def loop_inputs(n, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n % 20, 8)).astype(np.float32), (rng.standard_normal(8) * 3).astype(np.float32)


MODELS = {"plain": (plain, (dt.TensorSpec(("N", 8)),), plain_inputs, 500),
          "loops": (loops, (dt.TensorSpec(("T", 8)), dt.TensorSpec((8,))), loop_inputs, 30)}


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dyntvm-cache"))


def call_from_threads(model, inputs: list, want: list, calls: int, **kw) -> None:
    """THREADS threads, started together, each call `model` `calls` times cycling through `inputs` (each
    from its own offset) and compare with `want`; re-raise the first failure."""
    barrier = threading.Barrier(THREADS, timeout=60)
    failures = []

    def work(k):
        try:
            barrier.wait()
            for i in range(calls):
                j = (i + k) % len(inputs)
                assert_same(model(*inputs[j], **kw), want[j], what=f"thread {k} call {i} (input {j})")
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            failures.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread did not finish"
    if failures:
        raise failures[0]


@pytest.mark.parametrize("name", MODELS)
def test_threads_equal_serial(name, cache_dir):
    fn, specs, make, calls = MODELS[name]
    model = dt.compile(fn, *specs, cache_dir=cache_dir)
    inputs = [make(n, seed) for seed, n in enumerate(SIZES)]
    want = [model(*a) for a in inputs]                 # serial, on this thread
    for a, w in zip(inputs, want):
        assert_same(w, fn(*a), rtol=1e-4, atol=1e-5, what="serial vs eager")
    per_call = [_regions_run(model, a) for a in inputs]
    before = model.kernel_calls
    call_from_threads(model, inputs, want, calls)
    assert model.kernel_calls - before == sum(per_call[(i + k) % len(inputs)]
                                              for k in range(THREADS) for i in range(calls))


def _regions_run(model, args) -> int:
    before = model.kernel_calls
    model(*args)
    return model.kernel_calls - before


def test_threads_loaded_artifact(cache_dir, tmp_path):
    fn, specs, make, _ = MODELS["loops"]
    dt.compile(fn, *specs, cache_dir=cache_dir).save(str(tmp_path / "m.dtvm"))
    model = dt.load(str(tmp_path / "m.dtvm"))
    inputs = [make(n, seed) for seed, n in enumerate(SIZES)]
    want = [fn(*a) for a in inputs]
    call_from_threads(model, inputs, want, 30)


def test_threads_validate_and_profile(cache_dir):
    model = dt.compile(plain, dt.TensorSpec(("N", 8)), cache_dir=cache_dir)
    inputs = [plain_inputs(n, seed) for seed, n in enumerate(SIZES)]
    want = [plain(*a) for a in inputs]
    call_from_threads(model, inputs, want, 20, validate=True, profile=True)
    assert [calls for calls, _ in model.last_profile.values()] == [1]


def test_threads_first_call_in_a_thread(cache_dir):
    """Each thread's first call makes its executor; they all start at the same moment here."""
    model = dt.compile(plain, dt.TensorSpec(("N", 8)), cache_dir=cache_dir)
    inputs = [plain_inputs(n, seed) for seed, n in enumerate(SIZES)]
    call_from_threads(model, inputs, [plain(*a) for a in inputs], 1)


def test_tracing_in_threads_beside_eager_calls():
    """Each thread traces on its own builder stack: a trace in one thread neither breaks a trace in another
    nor puts another thread's eager calls into trace mode."""
    from dyntvm.ir.serialize import graph_to_json
    specs = MODELS["loops"][1]
    want_graph = graph_to_json(dt.trace(loops, *specs))[0]
    args = loop_inputs(5, 0)
    want = loops(*args)
    barrier = threading.Barrier(4, timeout=60)
    traced, eager = [], []           # a thread that raised leaves its list short

    def work(k):
        barrier.wait()
        for _ in range(10):
            if k % 2:
                traced.append(graph_to_json(dt.trace(loops, *specs))[0])
            else:
                eager.append(loops(*args))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(traced) == len(eager) == 20
    assert all(t == want_graph for t in traced)
    for e in eager:
        assert_same(e, want)


def test_hybridized_function_from_threads(cache_dir):
    """Builds of new signatures from several threads take turns (TVM's block builder is process-wide)."""
    fast = dt.hybridize(plain, dynamic=(("N", None),), cache_dir=cache_dir)
    inputs = [(np.full((n % 5, 4 + n % 6), n, np.float32),) for n in range(12)]
    call_from_threads(fast, inputs, [plain(*a) for a in inputs], 12)
    assert len(fast.compiled) == 6
