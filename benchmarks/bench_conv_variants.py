"""resnet18's conv layers (`bench_conv_layers.LAYERS`; `--layers mobilenet`: mobilenet_v3_small's pointwise ones,
`MOBILENET_1X1`), symbolic N, H, W, bias / relu / residual fused, compiled
under several variants of the CPU conv schedule's parameters, each timed against onnxruntime in the same process
(alternating blocks, this thread's CPU time, one thread each; batch 1): a ratio per variant and layer, and the
ratio summed over the model's layers. For trying a tile / reduction-block change before making it the default
(issue 24). Each variant's result is checked against onnxruntime first.

    TVM_NUM_THREADS=1 .venv/bin/python benchmarks/bench_conv_variants.py [--variants base,cb4,vb8]
                                                                         [--only 3x3] [--rounds 5]
                                                                         [--layers resnet18|mobilenet]
                                                                         [--block 0.25] [--stat median|min]

`--stat min` (with many short blocks, e.g. `--rounds 30 --block 0.015`): each side's fastest block, which a busy
machine's interference inflates least (a few % between two builds of one kernel under a load of 3-5, against 5-10%
for the median of 5 blocks).

Variants (module constants set while the layer compiles, restored after):
  base    as shipped
  cb1     CHANNEL_BLOCK 1
  cb2     CHANNEL_BLOCK 2
  cb4     CHANNEL_BLOCK 4 (input channels unrolled per reduction step; shipped: 8)
  cb16    CHANNEL_BLOCK 16
  tile7   AVX2 register tile of 16 channels x 7 positions (14 accumulators; shipped: 4)
  vb8     output channels packed in blocks of 8 (one AVX2 register) x 8 positions
  vb8t14  blocks of 8 x up to 14 positions
  ft8     AVX2 tiles of 16 channels x 4 positions over flattened positions too (`te_conv.FLAT_ACC_REGISTERS_AVX2` 8;
          shipped: 12, x 6 positions)
  ft10    AVX2 tiles of 16 channels x 5 positions over flattened positions (`te_conv.FLAT_ACC_REGISTERS_AVX2` 10)
  ft14    AVX2 tiles of 16 channels x 7 positions over flattened positions (14 accumulators)
  t4      AVX2 per-row tiles of 16 channels x 4 positions for unit-stride 3x3 convs too
          (`te_conv.ROW_ACC_REGISTERS_AVX2` 8; shipped: 10, x 5 positions)
  t5      AVX2 register tile of 16 channels x up to 5 positions per row, strided convs too (10 accumulators)
  t6      AVX2 register tile of 16 channels x up to 6 positions (12 accumulators)
  vb32t3  output channels packed in blocks of 32 (4 AVX2 registers) x 3 positions (12 accumulators)
  rows    a symbolic row computed in whole row tiles (`te_conv.FLAT_POSITIONS` False; shipped: flattened positions)
  flat0   flattened positions for every conv whose row the tile does not divide (`te_conv.FLAT_MIN_REDUCTION` 0)
  flat2048 flattened positions from 2048 multiply-adds an output (`te_conv.FLAT_MIN_REDUCTION`; shipped: 1152,
          resnet18's 128-channel 3x3 layers too)
  pwrows  pointwise convs per row (`te_conv.FLAT_POINTWISE` False; shipped: flattened up to 256 output channels, the
          ones outside `te_conv.POSITION_LANES`)
  pwflat  every pointwise conv over flattened positions (`te_conv.FLAT_POINTWISE_MAX_CHANNELS` None)
  pwocv   pointwise convs in the channels form, not vectorized along positions (`te_conv.POSITION_LANES` False)
  pwlanes every pointwise conv vectorized along positions (`te_conv.POSITION_LANES_MAX_CHANNELS` None)
  spwocv  strided 1x1 convs in the channels form per row (`te_conv.STRIDED_POSITION_LANES` False; shipped: vectorized
          along the positions of a copy of the strided input)
  pwnopad expanding pointwise convs on a plane the tile may not divide without the copy extended to whole tiles
          (`te_conv.PADDED_POSITIONS` False: the run-time fallback to the channels form over flattened positions)
  posinner the epilogue iterated positions-innermost (not `cpu_schedule_conv._channels_last`)
  spv     every conv in the spatial-vectorized form (output channels not blocked)
  spv8    spv, 8-position row tiles, up to 8 channels a tile (12 accumulators): a GEMM-like 1x1 tile
  spv16   spv, 16-position row tiles, up to 6 channels a tile (12 accumulators: MLAS's 6 x 16 on AVX2)
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":
    from thread_env import threads_from_argv     # the script's folder is on sys.path
    threads_from_argv(sys.argv + ["--threads", "1"], 1)

import argparse  # noqa: E402
import types  # noqa: E402

import numpy as np  # noqa: E402


def _vb32(out_per_group: int, cin_per_group: int, groups: int) -> int:
    if (cin_per_group == 1 and groups > 1) or out_per_group % 8:
        return 1
    return next(vb for vb in (32, 16, 8) if out_per_group % vb == 0)


def _vb8(out_per_group: int, cin_per_group: int, groups: int) -> int:
    return 1 if (cin_per_group == 1 and groups > 1) or out_per_group % 8 else 8


#: mobilenet_v3_small's pointwise layers at batch 1 (label, C, O, k, stride, pad, H = W, residual, count); all with
#: a relu here (the model's have relu, hardswish or none).
MOBILENET_1X1 = [
    ("1x1 16->72 @56", 16, 72, 1, 1, 0, 56, False, 1),
    ("1x1 72->24 @28", 72, 24, 1, 1, 0, 28, False, 1),
    ("1x1 24->88 @28", 24, 88, 1, 1, 0, 28, False, 1),
    ("1x1 88->24 @28 +res", 88, 24, 1, 1, 0, 28, True, 1),
    ("1x1 24->96 @28", 24, 96, 1, 1, 0, 28, False, 1),
    ("1x1 96->40 @14", 96, 40, 1, 1, 0, 14, False, 1),
    ("1x1 40->240 @14", 40, 240, 1, 1, 0, 14, False, 2),
    ("1x1 240->40 @14 +res", 240, 40, 1, 1, 0, 14, True, 2),
    ("1x1 48->288 @14", 48, 288, 1, 1, 0, 14, False, 1),
    ("1x1 96->576 @7", 96, 576, 1, 1, 0, 7, False, 3),
    ("1x1 576->96 @7 +res", 576, 96, 1, 1, 0, 7, True, 2),
]


def _gemm_channels(channels, row_tile, lanes):
    vectors = max(1, -(-row_tile // max(1, lanes)))
    return next((cb for cb in (8, 6, 4, 3, 2) if channels % cb == 0 and cb * vectors <= 12), 1)


def variants() -> dict:
    """{name: {(module, attribute): value}}"""
    from dyntvm.codegen import te_conv as tc
    from dyntvm.codegen.backends.cpu import cpu_schedule_conv as csc
    from dyntvm.codegen.converters import window as win
    return {
        "base": {},
        "cb1": {(csc, "CHANNEL_BLOCK"): 1},
        "cb2": {(csc, "CHANNEL_BLOCK"): 2},
        "cb4": {(csc, "CHANNEL_BLOCK"): 4},
        "cb16": {(csc, "CHANNEL_BLOCK"): 16},
        "tile7": {(tc, "_ACC_REGISTERS"): {512: 14, 256: 14}, (tc, "ROW_ACC_REGISTERS_AVX2"): 14},
        "vb8": {(win, "out_channel_block"): _vb8},
        "vb8t14": {(win, "out_channel_block"): _vb8, (tc, "_ACC_REGISTERS"): {512: 14, 256: 14}},
        "rows": {(tc, "FLAT_POSITIONS"): False},
        "ft8": {(tc, "FLAT_ACC_REGISTERS_AVX2"): 8},
        "ft10": {(tc, "FLAT_ACC_REGISTERS_AVX2"): 10},
        "ft14": {(tc, "FLAT_ACC_REGISTERS_AVX2"): 14},
        "t4": {(tc, "ROW_ACC_REGISTERS_AVX2"): 8},
        "t5": {(tc, "_ACC_REGISTERS"): {512: 14, 256: 10}},
        "t6": {(tc, "_ACC_REGISTERS"): {512: 14, 256: 12}, (tc, "ROW_ACC_REGISTERS_AVX2"): 12},
        "vb32t3": {(win, "out_channel_block"): _vb32, (tc, "_ACC_REGISTERS"): {512: 14, 256: 12}},
        "spv": {(win, "out_channel_block"): lambda o, c, g: 1},
        "posinner": {(csc, "_channels_last"): lambda sch, epi, n_sp: False},
        "spv8": {(win, "out_channel_block"): lambda o, c, g: 1, (tc, "_SPV_TILES"): (8, 8, 8),
                 (csc, "spv_channel_block"): _gemm_channels},
        "spv16": {(win, "out_channel_block"): lambda o, c, g: 1, (tc, "_SPV_TILES"): (16, 16, 16),
                  (csc, "spv_channel_block"): _gemm_channels},
        "flat0": {(tc, "FLAT_MIN_REDUCTION"): 0},
        "flat2048": {(tc, "FLAT_MIN_REDUCTION"): 2048},
        "pwrows": {(tc, "FLAT_POINTWISE"): False},
        "pwflat": {(tc, "FLAT_POINTWISE_MAX_CHANNELS"): None},
        "pwocv": {(tc, "POSITION_LANES"): False},
        "pwlanes": {(tc, "POSITION_LANES_MAX_CHANNELS"): None},
        "spwocv": {(tc, "STRIDED_POSITION_LANES"): False},
        "pwnopad": {(tc, "PADDED_POSITIONS"): False},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default="base,cb4,vb8")
    parser.add_argument("--only", default="", help="layers whose label contains one of these (comma-separated)")
    parser.add_argument("--layers", default="resnet18", choices=("resnet18", "mobilenet"),
                        help="resnet18's dense layers or mobilenet_v3_small's pointwise ones (MOBILENET_1X1)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block", type=float, default=0.25, help="seconds per timing block")
    parser.add_argument("--stat", default="median", choices=("median", "min"), help="of each side's blocks")
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)   # always 1
    args = parser.parse_args(argv)
    import tvm
    from tvm import relax
    import dyntvm as dt
    from dyntvm import F
    from bench_conv_layers import LAYERS, _cpu_times, _ort
    from bench_schedules import _region
    from dyntvm.codegen.backends.cpu.cpu_schedule import build_cpu, cpu_target
    known = variants()
    chosen = [v for v in args.variants.split(",") if v]
    unknown = [v for v in chosen if v not in known]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {sorted(known)}")
    only = [s for s in args.only.split(",") if s]
    target = cpu_target()
    rng = np.random.default_rng(0)
    print(f"target {target}; load {os.getloadavg()[0]:.2f}; ratios: dyntvm / onnxruntime (thread CPU time)",
          flush=True)
    total = {v: [0.0, 0.0] for v in chosen}
    for label, c, o, k, stride, pad, hw, residual, count in (LAYERS if args.layers == "resnet18" else MOBILENET_1X1):
        if only and not any(s in label for s in only):
            continue
        w = (rng.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype("float32")
        b = rng.standard_normal(o).astype("float32")
        ho = (hw + 2 * pad - k) // stride + 1
        x = rng.standard_normal((1, c, hw, hw)).astype("float32")
        r = rng.standard_normal((1, o, ho, ho)).astype("float32")

        def layer(v, *res, w=w, b=b, stride=stride, pad=pad):
            y = F.conv(v, w, b, stride=stride, padding=pad)
            return F.relu(y + res[0] if res else y)
        specs = [dt.TensorSpec(("N", c, "H", "W"))] + ([dt.TensorSpec(("N", o, "H", "W"))] if residual else [])
        targs = [tvm.runtime.tensor(x)] + ([tvm.runtime.tensor(r)] if residual else [])
        sess = _ort(w, b, stride, pad, residual, list(x.shape), list(r.shape), 1)
        feeds = {"x": x, **({"r": r} if residual else {})}
        want = sess.run(None, feeds)[0]
        runs = {"onnxruntime": types.SimpleNamespace(fn=lambda sess=sess, feeds=feeds: sess.run(None, feeds))}
        for name in chosen:
            saved = {key: getattr(*key) for key in known[name]}
            try:
                for (mod, attr), value in known[name].items():
                    setattr(mod, attr, value)
                mod_, fname = _region(layer, *specs)
                vm = relax.VirtualMachine(build_cpu(mod_, target), tvm.cpu())
            finally:
                for (mod, attr), value in saved.items():
                    setattr(mod, attr, value)
            f = vm[fname]
            got = f(*targs)
            got = (got if hasattr(got, "numpy") else got[0]).numpy()
            err = float(np.max(np.abs(got - want)))
            if not err < 1e-3:
                raise SystemExit(f"{label}, variant {name}: max |dyntvm - onnxruntime| {err}")
            runs[name] = types.SimpleNamespace(fn=lambda f=f: f(*targs))
        ms = {s: t[f"{args.stat}_ms"] for s, t in _cpu_times(runs, args.rounds, args.block).items()}
        flops = 2 * o * c * k * k * ho * ho
        ort_ms = ms["onnxruntime"]
        print(f"{label:24s} x{count} ort {ort_ms:7.3f} ms | " + " | ".join(
            f"{v} {ms[v] / ort_ms:5.2f} ({flops / ms[v] / 1e6:5.1f} GF/s)" for v in chosen), flush=True)
        for v in chosen:
            total[v][0] += ms[v] * count
            total[v][1] += ort_ms * count
    print("summed over the layers (x count), ratio to onnxruntime: "
          + " ".join(f"{v} {a / max(b_, 1e-9):.3f}" for v, (a, b_) in total.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
