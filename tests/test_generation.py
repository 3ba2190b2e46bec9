"""Generation with a GPT-2 style decoder (tests/zoo_generation.py), through ONNX:

* a greedy generation loop, `torch.jit.script`ed and exported by the TorchScript exporter as an ONNX Loop with a
  data-dependent trip count (stop when every row emitted EOS) that carries the tokens and a KV cache growing by one
  position each iteration: imported, compiled once, equal to onnxruntime token for token;
* the decoder step with past keys / values as inputs and outputs (dynamic batch, new and past lengths, the past
  starting empty), exported by either exporter and driven step by step from Python: compiled once, equal to
  onnxruntime at every step, at several batch sizes and prompt lengths (1 included)."""
import numpy as np
import onnx
import pytest

import dyntvm as dt
from dyntvm.codegen.build import stats

ort = pytest.importorskip("onnxruntime")
import zoo_generation as Z  # noqa: E402  (tests/ is on sys.path)
from model_exports import export_onnx  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("dyntvm-cache"))


def _compile_once(path, cache_dir):
    before = stats.builds
    compiled = dt.compile(dt.from_onnx(path), cache_dir=cache_dir, use_cache=False)
    assert stats.builds - before == 1
    return compiled, ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def test_greedy_generation_loop_with_kv_cache_matches_onnxruntime(cache_dir):
    path = export_onnx(Z.make_greedy, "greedy-generation", "torchscript")
    assert [n.op_type for n in onnx.load(path).graph.node].count("Loop") == 1
    compiled, session = _compile_once(path, cache_dir)
    rng = np.random.default_rng(0)
    lengths = set()
    for batch, prompt in [(1, 1), (2, 5), (3, 9), (1, 17), (4, 2)]:
        ids = rng.integers(0, Z.VOCAB, (batch, prompt)).astype(np.int64)
        (want,) = session.run(None, {"ids": ids})
        got = np.asarray(compiled(ids))
        assert got.shape == want.shape and np.array_equal(got, want), (batch, prompt, got, want)
        lengths.add(want.shape[1])
    assert len(lengths) > 1, "some prompts stop early at EOS, others run to the limit: the trip count varies"


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_kv_cache_decoder_driven_step_by_step_matches_onnxruntime(exporter, cache_dir):
    path = export_onnx(Z.make_step, "kv-cache-step", exporter)
    compiled, session = _compile_once(path, cache_dir)
    rng = np.random.default_rng(1)
    for batch, prompt in [(1, 1), (2, 4), (3, 7), (1, 12)]:
        ids = rng.integers(0, Z.VOCAB, (batch, prompt)).astype(np.int64)
        empty = np.zeros((Z.LAYERS, batch, Z.HEADS, 0, Z.HEAD_DIM), np.float32)
        ours, theirs = (empty, empty), (empty, empty)
        for step in range(5):
            want = session.run(None, {"ids": ids, "past_k": theirs[0], "past_v": theirs[1]})
            got = [np.asarray(g) for g in compiled(ids, *ours)]
            past = prompt + step - 1 if step else 0
            assert want[1].shape == (Z.LAYERS, batch, Z.HEADS, past + ids.shape[1], Z.HEAD_DIM)
            for k, (g, w) in enumerate(zip(got, want)):
                assert g.shape == w.shape, (exporter, batch, prompt, step, k, g.shape, w.shape)
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4,
                                           err_msg=f"{exporter}: batch {batch}, prompt {prompt}, step {step}, output {k}")
            tokens = want[0][:, -1].argmax(-1)
            assert np.array_equal(got[0][:, -1].argmax(-1), tokens)
            ids, ours, theirs = tokens[:, None].astype(np.int64), (got[1], got[2]), (want[1], want[2])
