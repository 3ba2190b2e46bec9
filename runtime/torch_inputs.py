"""Torch tensors given where dyntvm takes arrays (a compiled model's inputs, eager `F` calls, traced constants).

What converts without loss becomes a numpy view: a dense CPU tensor, also one that requires grad or is an
`nn.Parameter` (detached: dyntvm computes no gradients), or a lazily conjugated / negated view (resolved).
The rest is an InputError naming the input, what it is and what is expected: sparse and other non-strided
layouts, meta tensors (no data), tensors on another device (dyntvm's inputs are host arrays; `.cpu()` is
the user's explicit copy), quantized tensors, and dtypes dyntvm has no tensors of (bfloat16, complex, the
float8s). bfloat16 is refused rather than widened to float32: the widening is exact, but a compiled model
refuses a numpy array of the wrong dtype too (float16 for float32), so torch tensors follow the same rule
and `.float()` says what the user wants.

torch is never imported here: a tensor is recognised by its class's module, and torch is already in
`sys.modules` whenever such an object exists, so dyntvm runs without torch installed.
"""
from __future__ import annotations

import sys

import numpy as np

from dyntvm.errors import InputError

from ..ir.types import DTYPES


def is_torch_tensor(x) -> bool:
    torch = sys.modules.get("torch")
    return (torch is not None and type(x).__module__.partition(".")[0] == "torch"
            and isinstance(x, torch.Tensor))


def torch_to_numpy(x, label: str) -> np.ndarray:
    """`x` (a torch tensor, `is_torch_tensor`) as a numpy array sharing its memory, or an InputError."""
    torch = sys.modules["torch"]
    what = f"{label}: a torch tensor of {x.dtype} on {x.device}"
    expected = "expected a dense CPU tensor (or a numpy array)"
    if x.layout != torch.strided:
        raise InputError(f"{label}: a torch tensor with layout {x.layout} (sparse); {expected}: use .to_dense()")
    if x.device.type == "meta":
        raise InputError(f"{what}: a meta tensor has a shape but no data; {expected} with the values to run on")
    if x.device.type != "cpu":
        raise InputError(f"{what}; {expected}: copy it with .cpu()")
    if x.is_quantized:
        raise InputError(f"{what} (quantized); {expected} of one of {', '.join(DTYPES)}: use .dequantize()")
    x = x.detach().resolve_conj().resolve_neg()
    try:
        a = x.numpy()
    except (TypeError, RuntimeError) as e:       # a dtype numpy has not (bfloat16, float8), a tensor subclass
        a, reason = None, str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if a is None and str(x.dtype).removeprefix("torch.") in DTYPES:      # a dtype dyntvm has: not the dtype
        raise InputError(f"{what} ({type(x).__name__}) cannot be read as an array: torch: {reason}; {expected}, "
                         "e.g. from .to_padded_tensor(0) for a nested tensor, or a plain torch.Tensor")
    if a is None or a.dtype.name not in DTYPES:
        hint = ": use .float()" if x.dtype == torch.bfloat16 else ""
        raise InputError(f"{what}: dyntvm has no tensors of this dtype; {expected} of one of "
                         f"{', '.join(DTYPES)}{hint}" + (f" (torch: {reason})" if a is None else ""))
    return a
