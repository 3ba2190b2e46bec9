"""Torch models exported to ONNX for the real-model tests, by either of torch's exporters, cached by what made them.

`export_onnx(make, key, exporter)` calls `make()` -> (model, args, input_names, dynamic_axes) only when no export
made from the same key, the same source of `make`'s module (the models it builds) and the same torch / torchvision /
transformers versions is in the cache folder (`$DYNTVM_TEST_EXPORTS`, else a private folder in the temp dir). `dynamic_axes` is
{input_name: {axis: dim_name}}; the dynamo exporter gets the same dims as `torch.export.Dim`s.
"""
from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import inspect
import os
import tempfile
import time
import warnings
from typing import Callable

import numpy as np

import torch


def _versions() -> str:
    out = []
    for dist in ("torch", "torchvision", "transformers", "onnx", "onnxscript"):
        try:
            out.append(f"{dist}={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{dist}=-")
    return ",".join(out)


def cache_folder() -> str:
    folder = os.environ.get("DYNTVM_TEST_EXPORTS") or os.path.join(
        tempfile.gettempdir(), f"dyntvm-test-exports-{os.getuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return folder


def export(model, args, path: str, names, axes, dynamo: bool) -> str:
    """`model` exported to `path` with the dims named in `axes` ({input: {axis: name}}) dynamic."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            dims = {}
            shapes = tuple({ax: dims.setdefault(d, torch.export.Dim(d, min=1, max=4096)) for ax, d in axes.get(n, {}).items()}
                           for n in names)
            torch.onnx.export(model, args, path, dynamo=True, input_names=list(names), dynamic_shapes=shapes,
                              external_data=False, verbose=False)
        else:
            torch.onnx.export(model, args, path, dynamo=False, input_names=list(names), dynamic_axes=axes)
    return path


def export_onnx(make, key: str, exporter: str) -> str:
    """The path of `make()`'s model exported by `exporter` ("torchscript" or "dynamo"), from the cache when there."""
    assert exporter in ("torchscript", "dynamo"), exporter
    # the whole module of `make`: the helpers it calls (calibration, wrappers) change the export too
    source = inspect.getsource(inspect.getmodule(make) or make) + inspect.getsource(export)
    digest = hashlib.sha256("\0".join([key, exporter, source, _versions()]).encode()).hexdigest()[:24]
    path = os.path.join(cache_folder(), f"{digest}.onnx")
    if os.path.exists(path):
        return path
    model, args, names, axes = make()
    staging = f"{path}.{os.getpid()}.part"
    try:
        export(model, args, staging, names, axes, dynamo=exporter == "dynamo")
        os.replace(staging, path)
    finally:
        if os.path.exists(staging):
            os.unlink(staging)
    return path


@dataclasses.dataclass
class ModelCase:
    """One real model of the suite: how to build it, which exporters, which sizes, and what is known not to work.

    `make()` -> (model, args, input_names, dynamic_axes); `inputs(rng, size)` -> {input_name: array} for one entry
    of `sizes`; `cannot` maps an exporter to the exact reason the model cannot run through it (the test then
    expects that failure, so a fixed model shows up; a model that neither runs nor is listed fails the suite).
    `outputs(arrays)` picks / orders what is compared (detectors: boxes, scores, labels), defaults to all."""
    name: str
    make: Callable[[], tuple]
    inputs: Callable[[np.random.Generator, object], dict]
    sizes: list
    exporters: tuple = ("torchscript", "dynamo")
    cannot: dict = dataclasses.field(default_factory=dict)
    rtol: float = 1e-4
    atol: float = 1e-4
    outputs: Callable[[list], list] | None = None
    #: detections compared as a set (`match_detections`): rows of (boxes, labels, scores) whose scores are within
    #: float rounding of each other may come in either order, and NMS may keep either of two such boxes
    detections: bool = False
    #: how far a matched detection's score may be from onnxruntime's (`match_detections`)
    score_atol: float = 1e-4
    #: for detectors that paste masks (outputs boxes, labels, scores, pasted masks, raw masks): (raw mask, the
    #: detection's float boxes, (H, W)) -> every pasted mask that float error in the box legitimately gives
    #: (`match_detections`)
    mask_pastes: Callable | None = None


@dataclasses.dataclass
class CaseResult:
    """What running a case found: the numbers the README table shows, and per size the largest difference."""
    name: str
    exporter: str
    nodes: int
    regions: int
    compile_s: float
    builds: int
    sizes: list
    max_abs_err: list
    compiled: object = None
    path: str = ""


def run_case(case: ModelCase, exporter: str, cache_dir: str, seed: int = 0) -> CaseResult:
    """Export (cached), import, compile once and compare with onnxruntime at every size of `case`.

    Raises AssertionError on a mismatch (shape or value beyond the case's tolerance); dyntvm's own errors pass
    through so the caller can tell "cannot run" from "runs wrong"."""
    import onnxruntime as ort

    import dyntvm as dt
    from dyntvm.codegen.build import stats

    torch.manual_seed(seed)
    path = export_onnx(case.make, case.name, exporter)
    graph = dt.from_onnx(path)
    before = stats.builds
    start = time.perf_counter()
    compiled = dt.compile(graph, cache_dir=cache_dir, use_cache=False)
    compile_s = time.perf_counter() - start
    builds = stats.builds - before
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    rng = np.random.default_rng(seed)
    errors = []
    pick = case.outputs or (lambda arrays: arrays)
    for size in case.sizes:
        feeds = case.inputs(rng, size)
        feeds = {n: feeds[n] for n in names}
        want = pick(session.run(None, feeds))
        got = compiled(*feeds.values())
        got = pick([np.asarray(g) for g in (got if isinstance(got, (list, tuple)) else [got])])
        assert len(got) == len(want), (case.name, exporter, size, len(got), len(want))
        if case.detections:
            errors.append(match_detections(got, want, case.atol, f"{case.name} {exporter} at {size}",
                                           score_atol=case.score_atol, mask_pastes=case.mask_pastes))
            continue
        err = 0.0
        for k, (g, w) in enumerate(zip(got, want)):
            g = np.asarray(g)
            assert g.shape == w.shape, f"{case.name} {exporter} at {size}: output {k} shape {g.shape} != {w.shape}"
            np.testing.assert_allclose(g, w, rtol=case.rtol, atol=case.atol,
                                       err_msg=f"{case.name} {exporter} at {size}: output {k}")
            if g.size:
                err = max(err, float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))))
        errors.append(err)
    return CaseResult(case.name, exporter, len(graph.nodes), len(compiled.regions), compile_s, builds, list(case.sizes), errors,
                      compiled, path)


def match_detections(got: list, want: list, atol: float, where: str, score_atol: float = 1e-4,
                     mask_pastes: Callable | None = None) -> float:
    """Every detection of `got` (boxes [n, 4], labels [n], scores [n], and masks [n, ...] where the model has
    them) matched to its own detection of `want` with the same label, a score within `score_atol`, a box within
    `atol` (relative to the box scale) and a mask within `atol`; the sorted scores equal within `score_atol`.

    With a fifth output, the raw masks the pasted ones were made from, each pair's raw masks must agree within
    `atol`, and the pasted masks either agree or, where `mask_pastes(raw, boxes, (H, W))` finds the detection's
    box so near an integer truncation that float error in it pastes the mask a pixel apart, be each one of
    those pastes of its own raw mask (the rounding tie of Mask R-CNN: docs/onnx.md, "Real models").
    Returns the largest score difference of a matched pair."""
    got, want = [[np.asarray(a) for a in x] for x in (got, want)]
    assert len(got) == len(want) in (3, 4, 5), f"{where}: {len(got)} outputs, {len(want)} expected (3 to 5)"
    assert all(g.shape == w.shape for g, w in zip(got, want)), \
        f"{where}: shapes {[a.shape for a in got]} != {[a.shape for a in want]}"
    assert len(got) < 5 or mask_pastes is not None, f"{where}: raw masks but no `mask_pastes` to check them with"
    (gb, gl, gs), (wb, wl, ws) = got[:3], want[:3]
    gm, wm = (got[3], want[3]) if len(got) >= 4 else (None, None)
    graw, wraw = (got[4], want[4]) if len(got) == 5 else (None, None)
    np.testing.assert_allclose(np.sort(gs), np.sort(ws), rtol=0, atol=score_atol, err_msg=f"{where}: sorted scores")
    box_tol = atol * max(1.0, float(np.abs(wb).max(initial=0.0)))
    used = np.zeros(len(ws), bool)
    worst = 0.0

    def off(a, b) -> float:
        return float(np.abs(a - b).max(initial=0.0))

    def masks_match(i, j) -> bool:
        if gm is None or off(gm[i], wm[j]) <= atol:
            return graw is None or off(graw[i], wraw[j]) <= atol
        if graw is None or off(graw[i], wraw[j]) > atol:
            return False
        pastes = mask_pastes(graw[i], [gb[i], wb[j]], gm.shape[-2:])
        return len(pastes) > 1 and any(off(gm[i], p) <= atol for p in pastes) and \
            any(off(wm[j], p) <= atol for p in mask_pastes(wraw[j], [gb[i], wb[j]], wm.shape[-2:]))

    for i in range(len(gs)):
        near = np.abs(wb - gb[i]).max(axis=1, initial=0.0)
        ok = ~used & (wl == gl[i]) & (np.abs(ws - gs[i]) <= score_atol) & (near <= box_tol)
        cand = [j for j in np.flatnonzero(ok) if masks_match(i, j)]
        if not cand:       # say how near the nearest of the same label came
            same = np.flatnonzero(wl == gl[i])
            k = same[np.argmin(near[same])] if same.size else None
            nearest = "no detection of that label" if k is None else (
                f"nearest: score {ws[k]:.6f}, box off by {near[k]:.4f} (tolerance {box_tol:.4f})"
                + (f", mask off by up to {off(wm[k], gm[i]):.2e} at "
                   f"{int((np.abs(wm[k] - gm[i]) > atol).sum())} pixels" if gm is not None else "")
                + (f", raw mask off by up to {off(wraw[k], graw[i]):.2e}" if graw is not None else "")
                + (", already matched" if used[k] else ""))
            raise AssertionError(f"{where}: detection {i} (label {gl[i]}, score {gs[i]:.6f}, box {gb[i]}) has no "
                                 f"match in onnxruntime's; {nearest}")
        j = min(cand, key=lambda j: near[j])
        used[j] = True
        worst = max(worst, float(abs(ws[j] - gs[i])))
    return worst


def check_case(case: ModelCase, exporter: str, cache_dir: str) -> CaseResult | None:
    """The suites' one test: `case` through `exporter` compiles once and matches onnxruntime at >= 3 sizes, or,
    where `case.cannot` lists the exporter, fails with that reason (so a fix shows up as a failing test)."""
    import pytest

    reason = case.cannot.get(exporter)
    if reason is not None:
        with pytest.raises(Exception) as failure:
            run_case(case, exporter, cache_dir)
        assert reason in f"{type(failure.value).__name__}: {failure.value}", \
            f"{case.name} by {exporter} failed otherwise: {failure.value}"
        return None
    result = run_case(case, exporter, cache_dir)
    assert result.builds == 1, f"{case.name} by {exporter}: {result.builds} builds, one for every size expected"
    assert len(result.sizes) >= 3 and len(result.max_abs_err) == len(result.sizes), result
    return result
