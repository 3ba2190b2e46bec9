"""The bundled examples as ONNX models, imported with `dt.from_onnx`, compiled once and run at several sizes,
every output compared with onnxruntime on the same model, and with the example compiled from Python.

The ONNX forms are the ones the onnxruntime peer of benchmarks/bench_peers.py builds with `onnx.helper`
(`benchmarks/peers/*.py`, same weights as the examples): the LSTM as a Scan loop and as the ONNX LSTM op, the
transformer layer, the GRU decoder (Scan over the prompt, then a Loop to END), detection post-processing
(Compress, NonZero, TopK with a computed k) and the branchy model (Scan with an If per row, nested Ifs), plus
the peers' greedy decode (Loop) and mask MLP (Compress). Each symbolic dim is run at 1, at others, and at 0
where it means something (an empty sequence, prompt or box list); where onnxruntime refuses a size (a Scan over
zero steps), the example's eager numpy result is the reference instead.
"""
import os
import sys

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import examples

ort = pytest.importorskip("onnxruntime")
ort.set_default_logger_severity(4)          # sizes it refuses are expected (compared with eager instead)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from peers import branchy, decode, decoder, detection, lstm, mask, transformer  # noqa: E402

pytestmark = pytest.mark.slow


def _lstm_inputs(rng, T, B):
    xs, h0, c0 = examples.get("lstm").make_inputs(rng, T=T, B=B)
    return xs, (0.5 * rng.standard_normal(h0.shape)).astype(np.float32), \
        (0.5 * rng.standard_normal(c0.shape)).astype(np.float32)


def _example(name):
    ex = examples.get(name)
    return ex.fn, ex.specs, ex.make_inputs


_DECODE_SPECS = (dt.TensorSpec((), "int64", name="start"), dt.TensorSpec((decode.H,), name="h0"),
                 dt.TensorSpec((), "int64", name="max_steps"))
_LSTM_SIZES = ({"T": 0, "B": 1}, {"T": 1, "B": 1}, {"T": 5, "B": 3}, {"T": 17, "B": 1}, {"T": 3, "B": 16})

# name -> (ONNX builder, (python fn, specs) or None, make_inputs(rng, **sizes), size dicts, eager reference)
MODELS = {
    "lstm_scan": (lstm.onnx_scan, _example("lstm")[:2], _lstm_inputs, _LSTM_SIZES, examples.get("lstm").fn),
    "lstm_op": (lstm.onnx_lstm_op, _example("lstm")[:2], _lstm_inputs, _LSTM_SIZES, examples.get("lstm").fn),
    "transformer": (transformer.onnx_layer, _example("transformer")[:2], _example("transformer")[2],
                    ({"B": 1, "S": 1}, {"B": 2, "S": 7}, {"B": 1, "S": 33}, {"B": 4, "S": 16}),
                    examples.get("transformer").fn),
    "decoder": (decoder.onnx_scan_loop, _example("decoder")[:2], _example("decoder")[2],
                ({"P": 0}, {"P": 1}, {"P": 3}, {"P": 6}, {"P": 3, "max_steps": 0}, {"P": 4, "max_steps": 2},
                 {"P": 1, "max_steps": 1}), examples.get("decoder").fn),
    "detection": (detection.onnx_compress, _example("detection")[:2], _example("detection")[2],
                  ({"N": 0}, {"N": 1}, {"N": 1, "keep_fraction": 1.0}, {"N": 50, "keep_fraction": 0.0},
                   {"N": 3, "keep_fraction": 1.0}, {"N": 200}, {"N": 400, "keep_fraction": 0.3}),
                  examples.get("detection").fn),
    "branchy": (branchy.onnx_scan_if, _example("branchy")[:2], _example("branchy")[2],
                ({"B": 1}, {"B": 8}, {"B": 16, "shift": 1.0}, {"B": 4, "shift": -1.0}, {"B": 8, "scale": 0.05},
                 {"B": 1, "shift": 1.0}), examples.get("branchy").fn),
    "decode": (decode.onnx_loop, (decode.dyntvm_decode, _DECODE_SPECS),
               lambda rng, start, steps: (np.array(start, np.int64),
                                          (0.1 * rng.standard_normal(decode.H)).astype(np.float32),
                                          np.array(steps, np.int64)),
               ({"start": 1, "steps": 0}, {"start": 1, "steps": 1}, {"start": 1, "steps": 100},
                {"start": 7, "steps": 20}, {"start": 0, "steps": 5}), decode.numpy_decode),
    "mask": (mask.onnx_compress, (mask.dyntvm_mask_mlp, (dt.TensorSpec(("N", mask.D), name="x"),)),
             lambda rng, N, shift=0.0: ((rng.standard_normal((N, mask.D)) + shift).astype(np.float32),),
             ({"N": 0}, {"N": 1}, {"N": 50}, {"N": 9, "shift": -3.0}, {"N": 9, "shift": 3.0}),
             mask.numpy_mask_mlp),
}
# (model, size index) -> why onnxruntime's answer is not the reference there (the eager example is)
KNOWN_DIFFERENCES = {("lstm_op", 0): "a zero-length sequence: ONNX leaves LSTM's Y_h undefined; onnxruntime gives "
                                     "zeros, dyntvm initial_h (as the Scan form and the Python example do)"}
# (model, size index) -> why the Python form computes something else there (no comparison with it)
PYTHON_DIFFERS = {("decode", 4): "start == END: the peers' Python form tests the condition before the first step, "
                                 "the ONNX Loop (and numpy) after it"}
CASES = [(name, i) for name, m in MODELS.items() for i in range(len(m[3]))]


@pytest.fixture(scope="module")
def built():
    """name -> (ONNX model, onnxruntime session, dyntvm model compiled from it, dyntvm model compiled from the
    Python example): each compiled once for the module."""
    cache = {}

    def get(name):
        if name not in cache:
            make, py, *_ = MODELS[name]
            model = make()
            so = ort.SessionOptions()
            so.intra_op_num_threads = 1
            so.log_severity_level = 4
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
            cache[name] = (model, sess, dt.compile(dt.from_onnx(model)), dt.compile(py[0], *py[1]))
        return cache[name]
    return get


def _as_list(out):
    return [np.asarray(o) for o in (out if isinstance(out, (list, tuple)) else [out])]


def assert_outputs(got, want, what, rtol=1e-4, atol=1e-4):
    got, want = _as_list(got), _as_list(want)
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype, f"{what}: output {i} dtype {a.dtype}, expected {b.dtype}"
        assert a.shape == b.shape, f"{what}: output {i} shape {a.shape}, expected {b.shape}"
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"{what}: output {i}")
        else:
            np.testing.assert_array_equal(a, b, err_msg=f"{what}: output {i}")


@pytest.mark.parametrize("name,i", CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_onnx_example_matches_onnxruntime_and_python(built, name, i):
    model, sess, from_onnx, from_python = built(name)
    make_inputs, sizes, eager = MODELS[name][2], MODELS[name][3][i], MODELS[name][4]
    inputs = make_inputs(np.random.default_rng(100 + i), **sizes)
    got = from_onnx(*inputs)
    feed = dict(zip([vi.name for vi in model.graph.input], inputs))
    try:
        want, ref = sess.run(None, feed), "onnxruntime"
    except Exception:  # noqa: BLE001 - onnxruntime refuses this size (a Scan over zero steps): eager numpy instead
        want, ref = eager(*inputs), "the eager example (onnxruntime refuses this size)"
    if (name, i) in KNOWN_DIFFERENCES:
        want, ref = eager(*inputs), f"the eager example ({KNOWN_DIFFERENCES[name, i]})"
    assert_outputs(got, want, f"{name} at {sizes}: dyntvm from ONNX vs {ref}")
    # the same model written in Python (same weights), compiled by dyntvm: the two import paths agree
    if (name, i) not in PYTHON_DIFFERS:
        assert_outputs(from_python(*inputs), got, f"{name} at {sizes}: dyntvm from Python vs from ONNX")
