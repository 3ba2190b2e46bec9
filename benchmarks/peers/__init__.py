"""Workloads of `benchmarks/bench_peers.py`: one model, written once per system.

A `Workload` holds numpy inputs, the numpy implementation (the reference every other system is checked
against) and one builder per system. A builder does that system's setup (convert weights, build an ONNX
graph and an ORT session, `torch.compile` + its first call, `dt.compile`) and returns a `Prepared`: the
function that is timed, its arguments in the system's own format, and how to read its result back as
numpy. A system a workload does not map to has a reason in `Workload.na` instead of a builder.

Peer libraries (torch, onnx, onnxruntime) are imported inside the builders, so this package imports
without them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

# (key, label) in table order. "torch_lstm" / "ort_lstm" (the fused LSTM ops) only exist for LSTM rows.
SYSTEMS = (
    ("numpy", "numpy"),
    ("torch", "PyTorch eager"),
    ("torch_lstm", "torch nn.LSTM"),
    ("torch_compile", "torch.compile"),
    ("ort", "ONNX Runtime"),
    ("ort_lstm", "ORT LSTM op"),
    ("dyntvm", "dyntvm"),
    ("dyntvm_onnx", "dyntvm from ONNX"),     # ONNX Runtime's model, imported with dt.from_onnx
)
# on a CUDA GPU (`bench_peers.py --gpu`): the same builders with `BuildContext.device == "cuda"`
GPU_SYSTEMS = (
    ("torch_cuda", "PyTorch CUDA"),
    ("torch_lstm_cuda", "nn.LSTM CUDA"),
    ("dyntvm_cuda", "dyntvm CUDA"),
)
LABELS = dict(SYSTEMS + GPU_SYSTEMS)
REQUIRES = {"numpy": (), "torch": ("torch",), "torch_lstm": ("torch",), "torch_compile": ("torch",),
            "ort": ("onnx", "onnxruntime"), "ort_lstm": ("onnx", "onnxruntime"), "dyntvm": (),
            "dyntvm_onnx": ("onnx",),
            "torch_cuda": ("torch",), "torch_lstm_cuda": ("torch",), "dyntvm_cuda": ()}
NO_COMPILE_STEP = ("numpy", "torch", "torch_lstm")      # their "build" only wraps weights


class NotApplicable(Exception):
    """Raised by a builder when the workload cannot be expressed for that system (the message says why)."""


@dataclass
class Prepared:
    fn: Callable                       # the timed call: fn(*args)
    args: tuple
    to_numpy: Callable | None = None   # fn's result -> tuple of numpy arrays (None: already a tuple of them)
    info: dict = field(default_factory=dict)   # extra facts for the report (torch.compile graph breaks)
    keep: object = None                # objects that must outlive the call (sessions, modules)
    compile_s: float | None = None     # overrides the measured build time (torch.compile: its first call)


@dataclass
class Workload:
    key: str                           # file-friendly id, e.g. "lstm_B1_T64"
    label: str                         # table row, e.g. "LSTM B1 T64"
    group: str                         # a / b / c / d of the issue
    inputs: tuple                      # numpy arrays, one per model argument
    builders: dict                     # system key -> builder(ctx) -> Prepared
    na: dict = field(default_factory=dict)   # system key -> reason it does not apply
    exact: tuple = ()                  # indices of outputs compared exactly (tokens, indices)
    rtol: float = 1e-4
    atol: float = 1e-4
    note: str = ""

    def reference(self):
        """The numpy system's outputs: the reference of the correctness check."""
        p = self.builders["numpy"](None)
        return tuple(p.fn(*p.args))


@dataclass
class BuildContext:
    cache_dir: str | None = None       # dyntvm compile cache folder (None: dyntvm's default)
    threads: int = 2
    torch_backend: str = "inductor"    # torch.compile's backend ("eager": dynamo capture only, for the test)
    torch_cache_dir: str | None = None # inductor cache folder for this workload (None: torch's default)
    device: str = "cpu"                # "cuda": torch tensors on the GPU, dyntvm compiled for CUDA


def with_gpu_variants(w: Workload) -> Workload:
    """Add the GPU systems: each one is its CPU builder run with `device="cuda"`."""
    import dataclasses
    for gpu_key, _ in GPU_SYSTEMS:
        cpu_key = gpu_key[:-len("_cuda")]
        if cpu_key in w.builders:
            w.builders[gpu_key] = (lambda b: lambda ctx: b(dataclasses.replace(ctx, device="cuda")))(
                w.builders[cpu_key])
        elif cpu_key in w.na:
            w.na[gpu_key] = w.na[cpu_key]
    return w


def all_workloads(quick: bool = False, smallest: bool = False, gpu: bool = False) -> list[Workload]:
    """Every workload of the suite. `smallest`: tiny sizes for the correctness test (same code paths);
    `gpu`: with the GPU systems' builders (`with_gpu_variants`)."""
    from . import branchy, decode, decoder, detection, lstm, mask, transformer
    out = []
    out += lstm.workloads(quick, smallest)
    out += decode.workloads(quick, smallest)
    out += mask.workloads(quick, smallest)
    out += decoder.workloads(quick, smallest)
    out += detection.workloads(quick, smallest)
    out += branchy.workloads(quick, smallest)
    out += transformer.workloads(quick, smallest)
    return [with_gpu_variants(w) for w in out] if gpu else out
