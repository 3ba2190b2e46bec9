"""Torch tensors where dyntvm takes arrays: a compiled model's inputs, eager `F` calls, `dt.run_reference` and
`dt.hybridize`. What converts without loss is accepted (as a numpy view); the rest is an InputError naming the
input, what it is and what is expected (it used to be torch's own RuntimeError / TypeError)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F

torch = pytest.importorskip("torch")

SPEC = dt.TensorSpec(("N", 3))


def model_fn(x):
    return F.tanh(x) * 2.0


@pytest.fixture(scope="module")
def model():
    return dt.compile(model_fn, SPEC)


@pytest.fixture(scope="module")
def graph():
    return dt.trace(model_fn, SPEC)


def _values():
    return np.arange(12, dtype=np.float32).reshape(4, 3) / 10


ACCEPTED = {
    "requires_grad": lambda: torch.tensor(_values(), requires_grad=True),
    "parameter": lambda: torch.nn.Parameter(torch.tensor(_values())),
    "non_contiguous": lambda: torch.tensor(_values().T.copy()).T,
    "grad_result": lambda: torch.tensor(_values(), requires_grad=True) * 1.0,      # a non-leaf in the autograd graph
    "negated_view": lambda: torch._neg_view(torch.tensor(-_values())),     # the lazy negation bit (resolved)
    "real_conj": lambda: torch.tensor(_values()).conj(),                   # conj of a real tensor: itself
}

REFUSED = {       # name -> (tensor, what the message must say)
    "bfloat16": (lambda: torch.tensor(_values()).bfloat16(), "of torch.bfloat16 on cpu: dyntvm has no tensors of "
                 "this dtype; expected a dense CPU tensor (or a numpy array) of one of bool, int8"),
    "sparse": (lambda: torch.tensor(_values()).to_sparse(), "with layout torch.sparse_coo (sparse); expected a dense "
               "CPU tensor (or a numpy array): use .to_dense()"),
    "sparse_csr": (lambda: torch.tensor(_values()).to_sparse_csr(), "with layout torch.sparse_csr (sparse)"),
    "meta": (lambda: torch.empty(4, 3, device="meta"), "on meta: a meta tensor has a shape but no data"),
    "conjugated": (lambda: torch.tensor(_values()).to(torch.complex64).conj(), "of torch.complex64 on cpu: dyntvm "
                   "has no tensors of this dtype"),
    "quantized": (lambda: torch.quantize_per_tensor(torch.tensor(_values()), 0.1, 0, torch.quint8),
                  "(quantized); expected a dense CPU tensor (or a numpy array) of one of bool"),
    "float8": (lambda: torch.tensor(_values()).to(torch.float8_e4m3fn), "of torch.float8_e4m3fn on cpu: dyntvm has "
               "no tensors of this dtype"),
}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_lossless_tensors_are_accepted(model, graph, name):
    x = ACCEPTED[name]()
    requires_grad = x.requires_grad
    want = np.tanh(_values()) * 2
    np.testing.assert_allclose(model(x), want, rtol=1e-6)
    np.testing.assert_allclose(dt.run_reference(graph, x), want, rtol=1e-6)
    np.testing.assert_allclose(model_fn(x), want, rtol=1e-6)                    # eager
    np.testing.assert_allclose(dt.hybridize(model_fn)(x), want, rtol=1e-6)
    assert x.shape == (4, 3) and x.requires_grad == requires_grad               # the caller's tensor untouched
    np.testing.assert_array_equal(x.detach().resolve_neg().numpy(), _values())


def test_accepted_tensor_is_not_copied():
    x = torch.tensor(_values(), requires_grad=True)
    from dyntvm.runtime.torch_inputs import torch_to_numpy
    assert np.shares_memory(torch_to_numpy(x, "x"), x.detach().numpy())


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta", "ignore:torch.quantize_per_tensor")
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_lossy_tensors_are_refused(model, graph, name):
    make, message = REFUSED[name]
    x = make()
    with pytest.raises(dt.InputError) as e:
        model(x)
    assert str(e.value).startswith("input 0 ('x'): a torch tensor") and message in str(e.value)
    with pytest.raises(dt.InputError, match="input 0: a torch tensor") as e:
        dt.run_reference(graph, x)
    assert message in str(e.value)
    with pytest.raises(dt.InputError) as e:                                     # eager
        model_fn(x)
    assert message in str(e.value)
    with pytest.raises(dt.InputError) as e:
        dt.hybridize(model_fn)(x)
    assert message in str(e.value)


def test_bfloat16_message_says_how():
    with pytest.raises(dt.InputError, match=r"use \.float\(\)"):
        F.tanh(torch.ones(3, dtype=torch.bfloat16))


def test_dyntvm_runs_without_torch():
    """torch blocked (as if not installed): compiling, running and eager mode work, input checks included."""
    code = ("import sys\nsys.modules['torch'] = None\n"        # `import torch` now raises ImportError
            "import numpy as np, dyntvm as dt\nfrom dyntvm import F\n"
            "m = dt.compile(lambda x: F.tanh(x), dt.TensorSpec(('N',)))\n"
            "print(m(np.zeros(3, np.float32)).tolist(), F.tanh(np.zeros(2, np.float32)).tolist())\n"
            "try:\n    m('no array')\nexcept dt.InputError as e:\n    print('InputError')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["[0.0,", "0.0,", "0.0]", "[0.0,", "0.0]", "InputError"]
