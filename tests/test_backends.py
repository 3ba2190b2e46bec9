"""One backend per target (`codegen/backends`) and one device-type table (`runtime/devices.py`).

A third, fake target registered in the two tables is picked up everywhere: target parsing (`dt.compile`, the
CLI's --target), the build (its own build hook is what runs), the artifact (its device type recorded, accepted
on load, its device check run) and the runtime's device mapping; and no source file outside the backends and
the device table compares target names any more.
"""
from __future__ import annotations

import argparse
import ast
import os

import numpy as np
import pytest

import dyntvm as dt
from dyntvm import F
from dyntvm.codegen.backends import BACKENDS, backend_of, resolve
from dyntvm.codegen.backends.cpu import CPUBackend
from dyntvm.runtime.devices import DEVICES, DeviceType

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class FakeBackend(CPUBackend):
    """The CPU's kernels under another name, counting what dyntvm asks of it; ``fake:<n>`` takes an option."""
    name = "fake"
    device = "fake"
    forms = ("fake", "fake:N")

    def __init__(self):
        self.parsed, self.builds = [], 0

    def parse(self, target: str):
        option = target.partition(":")[2]
        if option and not option.isdigit():
            raise dt.CompileError(f"compile: target {target!r}: the fake option must be a number")
        self.parsed.append(target)
        return option or None

    def build(self, mod, tvm_target, loops=(), tuned=None, program=None):
        self.builds += 1
        return super().build(mod, tvm_target, loops, tuned, program)


@pytest.fixture
def fake(monkeypatch):
    backend, checked = FakeBackend(), []
    monkeypatch.setitem(BACKENDS, "fake", backend)
    monkeypatch.setitem(DEVICES, "fake", DeviceType("fake", "FAKE", "cpu", host=True,
                                                    check=lambda info, label: checked.append(label)))
    return backend, checked


def test_a_registered_target_is_used_everywhere(fake, tmp_path):
    backend, checked = fake
    from dyntvm.cli import _target
    assert _target("fake:3") == "fake:3"
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected cpu, cuda, cuda:sm_XX, fake or fake:N"):
        _target("fake:x")
    with pytest.raises(dt.CompileError, match="the fake option must be a number"):
        dt.compile(lambda x: x + 1.0, dt.TensorSpec(("N",)), target="fake:x")
    with pytest.raises(dt.CompileError, match=r"unknown target 'tpu'; expected cpu, cuda, cuda:sm_XX, fake or fake:N"):
        dt.compile(lambda x: x + 1.0, dt.TensorSpec(("N",)), target="tpu")

    fn = lambda x: F.tanh(x) * 2.0 + 1.0       # noqa: E731
    model = dt.compile(fn, dt.TensorSpec(("N", 3)), target="fake:2", use_cache=False)
    assert backend.builds == 1 and "fake:2" in backend.parsed
    assert model.target == "fake" and model.vm_program        # a host device: the VM program runs
    path = str(tmp_path / "m.dtvm")
    model.save(path)
    loaded = dt.load(path)
    assert loaded.target == "fake" and checked == [path]
    for n in (0, 1, 7):
        x = np.random.default_rng(n).standard_normal((n, 3)).astype("float32")
        want = np.tanh(x) * 2.0 + 1.0
        np.testing.assert_allclose(model(x), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(loaded(x), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(dt.ArtifactError, match=r"this is a FAKE artifact: its kernels run on fake, not cpu"):
        dt.load(path, device="cpu")


def test_unknown_device_types_are_clear_errors(tmp_path):
    with pytest.raises(dt.ArtifactError, match=r"unknown device type 'tpu' \(expected cpu or cuda\)"):
        from dyntvm.runtime.devices import device_type
        device_type("tpu")
    model = dt.compile(lambda x: x * 2.0, dt.TensorSpec(("N",)))
    path = str(tmp_path / "m.dtvm")
    model.save(path)
    for bad in (["cpu"], ("cpu",), "tpu", 3):     # a list is unhashable: a clear error, not a raw TypeError
        with pytest.raises(dt.ArtifactError, match=r"unknown device"):
            dt.load(path, device=bad)


def test_targets_resolve_to_their_backends():
    cpu, cuda = resolve("cpu"), resolve("cuda:sm_80")
    assert (cpu.name, cpu.device, cuda.name, cuda.device) == ("cpu", "cpu", "cuda", "cuda")
    assert cuda.parse("cuda:sm_80") == "sm_80" and cuda.parse("cuda") is None
    assert backend_of(cpu.concrete_target("cpu")) is cpu
    for bad in ("cpu:avx", "", None, 3, "cuda:80"):
        with pytest.raises(dt.CompileError):
            resolve(bad)
    assert set(BACKENDS) <= set(DEVICES)       # every backend's device type has its line in the runtime's table


# Comparisons with a target name are what the backends replaced; these remain, each for its reason.
ALLOWED = {
    ("codegen/loop_buffers.py", "names.device != 'cuda'"):
        "the variant of loop code the CUDA backend asks for (`CUDABackend.loop_specs`), not a target string",
    ("runtime/torch_inputs.py", "x.device.type != 'cpu'"): "a torch tensor's device, not a dyntvm target",
}


def _target_comparisons() -> list:
    """(file, source) of every comparison with "cpu", "cuda" or "llvm", and every ``tvm.cuda(...)`` call, in the
    package's source outside the backends' folders and the device table."""
    skip = ("codegen/backends/cpu/", "codegen/backends/cuda/", "runtime/devices.py")
    found = []
    for folder in ("codegen", "runtime", "dyntvm", "frontend", "partition", "ir"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for fn in sorted(files):
                rel = os.path.relpath(os.path.join(dirpath, fn), ROOT).replace(os.sep, "/")
                if not fn.endswith(".py") or rel.startswith(skip):
                    continue
                with open(os.path.join(ROOT, rel)) as f:
                    tree = ast.parse(f.read(), rel)
                for node in ast.walk(tree):
                    named = isinstance(node, ast.Compare) and any(
                        isinstance(c, ast.Constant) and c.value in ("cpu", "cuda", "llvm") for c in ast.walk(node))
                    cuda_call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                        node.func.attr == "cuda"
                    if named or cuda_call:
                        found.append((rel, ast.unparse(node)))
    return found


def test_no_target_names_compared_outside_the_backends():
    found = _target_comparisons()
    assert ("codegen/loop_buffers.py", "names.device != 'cuda'") in found       # the scan finds them
    assert [f for f in found if f not in ALLOWED] == []
