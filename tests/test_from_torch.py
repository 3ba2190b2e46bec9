"""`dt.from_torch`: torch programs through torch.export, compiled once, equal to torch eager at several sizes."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dyntvm as dt  # noqa: E402
from dyntvm.errors import DyntvmError, UnsupportedOpError  # noqa: E402
from dyntvm.frontend.torch_ops import TorchImportError  # noqa: E402

from helpers import assert_same  # noqa: E402
import torch_examples as tex  # noqa: E402
from torch.export import Dim  # noqa: E402


def eager(module, *args):
    """torch eager's outputs as numpy arrays (flattened as the graph's)."""
    with torch.no_grad():
        out = module(*[torch.from_numpy(np.array(a, copy=True)) for a in args])
    out = out if isinstance(out, (tuple, list)) else (out,)
    return [o.numpy() for o in out]


def check(model, module, inputs, rtol=1e-4, atol=1e-5):
    got = model(*inputs)
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    assert_same(got, eager(module, *inputs), rtol=rtol, atol=atol)


rng = np.random.default_rng(0)
f32 = lambda *s: rng.standard_normal(s).astype(np.float32)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.l1, self.l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return torch.softmax(self.l2(torch.relu(self.l1(x))), dim=-1)


@pytest.mark.slow
def test_mlp_symbolic_batch():
    m = MLP().eval()
    g = dt.from_torch(m, (torch.randn(3, 8),), dynamic_shapes={"x": {0: Dim("B")}})
    assert g.inputs[0].name == "x" and g.inputs[0].type.shape == ("B", 8)
    model = dt.compile(g)
    for b in (0, 1, 2, 17):
        check(model, m, [f32(b, 8)])


def test_function_short_dims_and_numpy_examples():
    """A plain function, numpy example args, and a str for a Dim (the same name: one symbol, checked equal)."""
    def f(a, b):
        return (a * 2 + b).sum(dim=1), torch.tanh(a - b).amax(dim=0)
    g = dt.from_torch(f, (f32(4, 3), f32(4, 3)), dynamic_shapes=({0: "N"}, {0: "N"}))
    assert [v.type.shape for v in g.inputs] == [("N", 3), ("N", 3)]
    model = dt.compile(g)
    for n in (1, 5):
        a, b = f32(n, 3), f32(n, 3)
        assert_same(list(model(a, b)), [((a * 2 + b).sum(1)), np.tanh(a - b).max(0)], rtol=1e-5, atol=1e-5)
    with pytest.raises(DyntvmError):        # the shared symbol: unequal sizes refused when it runs
        model(f32(2, 3), f32(3, 3))


@pytest.mark.slow
def test_transformer_example():
    m = tex.Transformer()
    from dyntvm.examples import transformer as ex
    x, mask = ex.make_inputs(np.random.default_rng(1), B=2, S=5)
    g = dt.from_torch(m, (x, mask), dynamic_shapes={"x": {0: "B", 1: "S"}, "mask": {0: "B", 1: "S"}})
    model = dt.compile(g)
    for i, (b, s) in enumerate([(1, 1), (2, 7), (3, 33)]):
        check(model, m, ex.make_inputs(np.random.default_rng(i), B=b, S=s), rtol=1e-4, atol=1e-4)
    # the F version of the example agrees too
    x, mask = ex.make_inputs(np.random.default_rng(9), B=2, S=6)
    np.testing.assert_allclose(model(x, mask), ex.encoder_layer(x, mask), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_lstm_scan():
    m = tex.LSTM()
    from dyntvm.examples import lstm as ex
    g = dt.from_torch(m, ex.make_inputs(np.random.default_rng(0), T=3, B=2),
                      dynamic_shapes={"xs": {0: "T", 1: "B"}, "h0": {0: "B"}, "c0": {0: "B"}})
    ops = {n.op for n in g.nodes}
    assert "foreach" in ops
    model = dt.compile(g)
    for t, b in ((0, 1), (1, 1), (7, 3)):
        inputs = ex.make_inputs(np.random.default_rng(t), T=t, B=b)
        if t:               # torch's eager scan refuses 0 steps; the F version is the reference there
            check(model, m, inputs, atol=1e-4)
        assert_same(list(model(*inputs)), list(ex.lstm(*inputs)), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_branchy_cond_map_different_widths():
    m = tex.Branchy()
    from dyntvm.examples import branchy as ex
    g = dt.from_torch(m, ex.make_inputs(np.random.default_rng(0), B=4), dynamic_shapes={"x": {0: "B"}})
    assert {"case", "foreach"} <= {n.op for n in g.nodes}     # nested conds merged (test_from_torch_cond.py)
    model = dt.compile(g)
    widths = set()
    for i, sizes in enumerate(ex.EXAMPLE.test_sizes):
        inputs = ex.make_inputs(np.random.default_rng(i), **sizes)
        check(model, m, inputs, atol=1e-4)
        widths.add(model(*inputs)[0].shape[1])
    assert len(widths) >= 3         # the heads of different widths were taken


def test_detection_data_dependent():
    m = tex.Detection()
    from dyntvm.examples import detection as ex
    g = dt.from_torch(m, ex.make_inputs(np.random.default_rng(0), N=50), dynamic_shapes={"scores": {0: "N"},
                                                                                        "boxes": {0: "N"}})
    model = dt.compile(g)
    kept = set()
    for i, sizes in enumerate(ex.EXAMPLE.test_sizes):
        inputs = ex.make_inputs(np.random.default_rng(i), **sizes)
        check(model, m, inputs, atol=1e-4)
        kept.add(model(*inputs)[0].shape[0])
    assert 0 in kept and len(kept) >= 3


@pytest.mark.slow
def test_decoder_while_loop():
    """torch's while_loop wants loop values of fixed shape: the decoder as a token buffer and a length."""
    m = tex.Decoder()
    from dyntvm.examples import decoder as ex
    prompt, steps = ex.make_inputs(np.random.default_rng(0), P=3)
    g = dt.from_torch(m, (prompt, steps), dynamic_shapes={"prompt": {0: "P"}, "max_steps": None})
    assert "while_loop" in {n.op for n in g.nodes}
    model = dt.compile(g)
    lengths = set()
    for i, sizes in enumerate(ex.EXAMPLE.test_sizes):
        inputs = ex.make_inputs(np.random.default_rng(i), **sizes)
        if len(inputs[0]):      # torch's eager scan refuses an empty prompt; the F version is the reference there
            check(model, m, inputs)
        buf, n = model(*inputs)
        want_buf, want_n = tex.decoder_reference(*inputs)
        assert int(n) == want_n and (buf[:want_n] == want_buf[:want_n]).all()     # = the F version
        lengths.add(int(n))
    assert len(lengths) >= 3


class DataDependent(torch.nn.Module):
    def forward(self, x, y):
        nz = torch.nonzero(x > 0)                   # [K, 2]
        sel = torch.masked_select(y, y > 0.5)       # [M]
        rows = x[x.sum(dim=1) > 0]                  # [R, 4]
        u = torch.unique(torch.round(y * 2))        # [U]
        return nz, sel * 2, rows + 1, u


def test_data_dependent_ops():
    m = DataDependent()
    g = dt.from_torch(m, (f32(5, 4), f32(7)), dynamic_shapes={"x": {0: "N"}, "y": {0: "M"}})
    model = dt.compile(g)
    for n, k in ((0, 0), (1, 1), (2, 9), (30, 40)):
        check(model, m, [f32(n, 4), f32(k)])
    check(model, m, [np.full((3, 4), -1, np.float32), np.zeros(5, np.float32)])     # nothing kept


class CondShapes(torch.nn.Module):
    """A cond whose branches return different shapes: torch.export gives it an unbacked size, dyntvm an unknown
    dim of the cond's result."""

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda x: x[x > 0], lambda x: torch.cat([x, x]), (x,))


def test_cond_branches_of_different_shapes():
    m = CondShapes()
    g = dt.from_torch(m, (f32(6),), dynamic_shapes={"x": {0: "N"}})
    model = dt.compile(g)
    for x in (np.ones(3, np.float32), -np.ones(4, np.float32), f32(1), f32(9), np.zeros(0, np.float32)):
        check(model, m, [x])


def test_unsupported_ops_listed_with_source_lines():
    def f(x):
        y = torch.special.bessel_j0(x)
        return torch.special.bessel_j1(y) + 1
    with pytest.raises(UnsupportedOpError) as e:
        dt.from_torch(f, (torch.randn(3),))
    msg = str(e.value)
    assert "bessel_j0" in msg and "bessel_j1" in msg, msg
    assert "test_from_torch.py" in msg and "torch.special.bessel_j0(x)" in msg, msg


def test_bad_inputs_are_clear_errors():
    with pytest.raises(TorchImportError, match="torch.nn.Module or a function"):
        dt.from_torch("not a model", (torch.randn(2),))
    with pytest.raises(TorchImportError, match="example_args must be a tuple"):
        dt.from_torch(MLP(), "x")
    with pytest.raises(TorchImportError, match="torch.export refused"):     # wrong example: 8 features expected
        dt.from_torch(MLP(), (torch.randn(3, 5),))


def test_growing_while_loop_refused_by_torch_export_with_a_hint():
    """torch.export's while_loop wants loop values of fixed shape (dyntvm's F.while_loop does not): the refusal
    says so and points at F.while_loop."""
    from torch._higher_order_ops.while_loop import while_loop

    def grow(x):
        return while_loop(lambda t: t.shape[0] < 10, lambda t: (torch.cat([t, t[:1]]),), (x,))
    with pytest.raises(TorchImportError, match=r"(?s)torch.export refused.*F\.while_loop takes values that change"):
        dt.from_torch(grow, (torch.randn(3),))


def test_cli_compile_torch(tmp_path, capsys):
    """`dyntvm compile file.py:make --torch`: make() returns (module, example_args, dynamic_shapes)."""
    from dyntvm.cli import main
    (tmp_path / "model.py").write_text(
        "import torch\n\n"
        "def f(x):\n    return torch.tanh(x).cumsum(dim=0) * 2\n\n"
        "def make():\n    return f, (torch.randn(4, 3),), {'x': {0: 'N'}}\n\n"
        "def bad():\n    return 3\n")
    out = str(tmp_path / "m.dtvm")
    assert main(["compile", f"{tmp_path}/model.py:make", "--torch", "-o", out]) == 0
    model = dt.load(out)
    for n in (1, 6):
        x = f32(n, 3)
        np.testing.assert_allclose(model(x), np.cumsum(np.tanh(x), axis=0) * 2, rtol=1e-5, atol=1e-5)
    assert main(["compile", f"{tmp_path}/model.py:bad", "--torch", "-o", out]) != 0
    assert "must return (module, example_args)" in capsys.readouterr().err


def test_a_buffer_updated_in_place_is_named_in_a_warning():
    """Review 33 #8: a module that updates a buffer in place (a counter, a cache) is imported with the buffer as a
    constant - every call sees the export's value - so from_torch says so, naming it."""
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x):
            self.calls.add_(1.0)
            return x + self.calls

    with pytest.warns(UserWarning, match="buffer calls"):
        dt.from_torch(Counter(), (torch.ones(3),))
