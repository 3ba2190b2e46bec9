"""TE computes of `conv` for the CPU (`converters/window.py`), in the forms the CPU conv schedule
(`cpu_schedule_conv`) finds by block name:

* ``dt_conv_ocv`` (output channels vectorized): the weight packed ``[O / vb, C / groups, *K, vb]`` (a
  block of `vb` output channels contiguous, as TVM's x86 ``conv2d_NCHWc`` packs it), so a vector of `vb`
  output channels is one weight load and every input value one broadcast; used where `vb` divides the
  output channels of a group. A 1x1 kernel is then a GEMM micro-kernel (weight vectors times broadcast
  input values into a register tile of output channels x output positions).
* ``dt_conv_spv`` (spatial vectorized): the weight as given ``[O, C / groups, *K]``, vectorized along the
  last output axis: depthwise convolutions (one input channel per output channel) and groups whose
  output channels `vb` does not divide.
* ``dt_conv_pad``: the zero-padded input, a stage of its own (no padding: none) that the schedule computes
  inside the kernel, once per batch element; the reduction then reads it without a bounds test. Whole ragged
  tiles without padding read the row's last input instead in ``dt_conv_ocv`` (the index clamped, no copy).
* ``dt_conv_crop``: where no register tile divides the output rows (a symbolic width, a prime), the convolution
  is computed over whole tiles (the padded input extended with zeros) and this stage keeps the first W. A dense
  conv of 2+ spatial axes and a long reduction is computed over the flattened positions of each plane instead
  (`FLAT_POSITIONS`, `_te_conv_flat`), and this stage reads [N, O, H, W] back from [N, O, ceil(H * W / t) * t].
* ``dt_conv_pwp`` (positions vectorized): a pointwise 2-D conv (1x1, stride 1, no padding, one group) as the GEMM
  [O, H * W] = W[O, C] x X[C, H * W] per image, the positions - contiguous in NCHW - the vector lanes, a weight
  value the broadcast (`POSITION_LANES`); the crop stage reads [N, O, H, W] back from [N, O, whole vectors]. A strided
  1x1 conv is this GEMM on a copy of its strided positions (`STRIDED_POSITION_LANES`, ``STRIDED_BLOCK``); the TE of
  both forms is in `te_conv_pwp`.

Data and result stay NCHW (NCW, NCDHW): no layout change crosses the kernel's boundary, so symbolic batch and
spatial dims, fusion with the epilogue (bias, activation, residual) and the rest of the graph are as before.
"""
from __future__ import annotations

import functools

import tvm_ffi
from tvm import DataType, te, tirx

from .dims import i64 as _i64

from .te_conv_names import (CROP_BLOCK, FLAT_ATTR, OCV_BLOCK, PAD_BLOCK, PHASES_BLOCK,  # noqa: F401 - te_conv.X
                            PWP_BLOCK, PWP_ROWS_ATTR, ROW_TILE_ATTR, SPLIT_SUFFIX, SPV_BLOCK, STRIDED_BLOCK)
from .te_conv_pwp import te_conv_pointwise, te_conv_strided_pointwise

# Register tiles. ocv: vb channels x `tw` output positions of a row. AVX-512 (32 registers, 16 fp32 lanes: vb = 16
# is one register): 14 positions (14 accumulators, as TVM's x86 conv2d picks reg_n). AVX2 (16 registers: vb = 16 is
# two): 4 positions - 8 accumulators, 2 weight vectors, 1 broadcast. 7 positions (14 accumulators) spilled to the
# stack; 6 (12) are ~1.1x faster than 4 where they divide the row, but a symbolic row is computed in whole tiles,
# and resnet's 7- and 14-wide rows would then compute 12 and 18 positions (8 and 16 with 4: 1.8x faster on the
# 512-channel 7 x 7 layer). Static rows: the tile of fewest latency-bound tiles (`row_tile`), else ragged tiles. spv: up
# to 64 positions (4 AVX-512 or 8 AVX2 registers), down to 32. A row that no such divisor tiles (a symbolic size,
# a prime) is computed over whole ragged tiles into a buffer a crop stage reads (no predicate in the reduction).
_ACC_REGISTERS = {512: 14, 256: 8}
_SPV_TILES = (64, 32, 8)      # (the last: the ragged tile of a symbolic width)
#: A strided spv convolution reads its padded input stored as phases (`_padded_phases`; not one that `STRIDED_LANES`
#: takes); False: as before.
PHASED_STRIDES = True
#: A strided spv convolution (depthwise, small groups) reads its zero-padded input (`_padded`, the plain copy of the
#: unstrided ones) `stride` apart, not a phases copy: the vectorized row tile's loads ``x[Ramp(base, stride, lanes)]``
#: are written by the CPU build as contiguous vector loads and a shuffle (`backends/cpu/cpu_strided_loads.py`; TVM's
#: LLVM code generator alone gathers the lanes one by one). The phases copy (a deinterleave with a row's fixed costs
#: and padding loops) was about half of mobilenet_v3_small's 72-channel 3x3 / 2 layer's time. False: `PHASED_STRIDES`
#: as before (a switch for A/B).
STRIDED_LANES = True
#: ... for kernels of at most this many taps along the row (each tap's vector is 2 loads and 2 shuffles for stride 2):
#: mobilenet_v3_small's 5x5 / 2 layers took 1.06x (96 @ 28) and 1.19x (288 @ 14) their phases form's time, the 3x3 / 2
#: ones 0.84x (72 @ 56) and 1.0x (16 @ 112) (`bench_dw_layers.py --kernel --only /2 --ab te_conv.STRIDED_LANES`).
STRIDED_LANES_MAX_TAPS = 3
#: ... and strides up to this (the strides `cpu_strided_loads` rewrites: about `stride` vector loads a lane-strided
#: load)
STRIDED_LANES_MAX_STRIDE = 4
#: A strided spv convolution's phases copy (`_padded_phases`) marks its column bounds ``likely``: TIR's LoopPartition
#: pass then splits the column loop into its padding and its interior (symbolic bounds too), and the interior, iterated
#: (column, phase) with the phases unrolled (`cpu_schedule_depthwise.schedule_phases`), is an unconditional read of
#: `stride` contiguous inputs per step that LLVM loads as vectors and deinterleaves with shuffles. False: one loop,
#: phase outermost, a bounds test per element (a scalar loop with a branch per element: most of mobilenet_v3_small's
#: stride-2 depthwise layers' time).
SPLIT_PHASES = True
#: ... but not for a conv of at least this many (static) channels, where the rows are short in the nets that have
#: them: mobilenet_v3_small's 288-channel 5x5 / 2 layer at 14 (10 phase columns, 7 of them interior: a vector loop
#: of 4, a scalar remainder and the padding loops per row) took 1.56-1.6x its unsplit copy's time (per image; per
#: channel block, `cpu_schedule_depthwise.COPY_PER_CHANNEL_BLOCK`, 1.1-1.34x), where the 72- and 16-channel 3x3 / 2
#: layers at 56 and 112 took 0.85x and 0.6-0.7x. Not split: a test per element, unrolled by phase.
SPLIT_PHASES_MAX_CHANNELS = 128
#: ... and the rows of those copies (`_likely_bounds`): the row loop split into padding and interior rows, whose
#: column loops then test no row bound (with the columns' tests and the guard, a row's scalar remainder and padding
#: loops kept up to four tests an element). False: only the columns split (a switch for A/B).
SPLIT_ROWS = True
#: ... and the padded copy of an unstrided spv convolution (depthwise, small groups: `_padded`'s `split_columns`),
#: parallel over channels (`cpu_schedule_depthwise.schedule_phases`); False: masked loads per element (LLVM's mask
#: from 64-bit indices per vector), parallel over channels x rows.
SPLIT_SPV_PADDING = True
#: A padded copy reads the size check's guard in its condition (`_guarded`); False: as its padding value, as before.
GUARD_IN_CONDITION = True
#: A dense (``dt_conv_ocv``) convolution of 2+ spatial dims whose row the register tile does not divide (a symbolic
#: width, a 7- or 14-wide row) is computed over the flattened positions of each plane (h * W + w, whole tiles of
#: the row tile, the last cut): a symbolic 7 x 7 plane is then 52 positions (13 tiles of 4), not 7 rows of 8 (56),
#: and 14 x 14 is 196, not 224. False: per row (a switch for A/B).
FLAT_POSITIONS = True
#: ... for convs of at least this many multiply-adds per output (input channels of a group x kernel taps): each tile
#: of flattened positions computes its positions' rows and columns (divisions) and keeps one input pointer per
#: position and kernel row, a cost per tile that a short reduction does not amortize. 2048 with the tile of 4
#: positions; with 6 (`FLAT_ACC_REGISTERS_AVX2`) 1152: resnet18's 3x3 / 2 128 -> 256 (14-wide rows: per row 16
#: positions) 1.18x -> 1.03x onnxruntime's time, its 128-channel 3x3 at 28 x 28 (rows of 7 tiles of 4) 1.00x / 1.01x
#: (`bench_conv_variants.py --variants base,flat1152`, one thread, 9 rounds); the 64-channel 3x3 layers (576) flat:
#: 1.05-1.2x their per-row time (`flat0`).
FLAT_MIN_REDUCTION = 1152
#: Accumulator registers of the register tile of a conv over flattened positions on AVX2 (16 ymm; blocks of 16
#: channels; AVX-512 and blocks of 8 keep the ragged tile, 8 positions): 12 - 16 channels x 6 positions, 2 weight
#: vectors and a broadcast beside them - where the per-row form's 8 (x 4 positions) are the FMAs' latency x
#: throughput exactly. A flattened plane wastes at most a
#: tile's positions (7 x 7: 54 for 49, 14 x 14: 198 for 196); per row, ragged tiles of 6 took 1.2-2.3x the time of
#: tiles of 4 (a symbolic 56-wide row: 60 positions). resnet18's flat layers, one thread, against onnxruntime in one
#: process (`bench_conv_variants.py --only 3x3 --variants base,t6`, 8 -> 12): the 256-channel 3x3 at 14 x 14 1.17x ->
#: 1.09x, 3x3 / 2 256 -> 512 1.08x -> 0.91x, the 512-channel 3x3 at 7 x 7 1.20x -> 1.01x. 8: the per-row tile (a
#: switch for A/B).
FLAT_ACC_REGISTERS_AVX2 = 12
#: ... and for pointwise convs (a 1x1 kernel, stride 1, no padding: `is_pointwise`) whatever their reduction: the
#: flattened position is the input's (h * W + w: one input pointer per position, no kernel rows), and a symbolic 28-,
#: 14- or 7-wide row is then 784, 196 or 49 positions in whole tiles of the plane, not rows of ragged tiles (32,
#: 16, 8 positions). Layer by layer (session 41, one thread, one process) 0.8-0.9x the per-row time of the narrow
#: ones of mobilenet_v3_small (240 -> 40, 144 -> 48, 24 -> 88, 72 -> 24 channels), but 1.25x for 96 -> 576 at 7 x 7
#: and 1.1x for 48 -> 288 at 14 x 14: hence only up to FLAT_POINTWISE_MAX_CHANNELS output channels. For every
#: pointwise conv the model was no faster (1.01x / 1.01x `bench_conv_models.py --ab`, 1.03x / 0.99x
#: `bench_model_ab.py --ab`); with the bound, mobilenet_v3_small B1 one thread against this rule off in one process:
#: 0.92x / 0.90x (`bench_conv_models.py --ab`, wall), 0.98x / 0.93x (`bench_model_ab.py --ab`, thread CPU time),
#: 1.00x / 0.96x (two more, thread time). False: per row (a switch for A/B).
FLAT_POINTWISE = True
#: ... for pointwise convs of at most this many output channels (None: any).
FLAT_POINTWISE_MAX_CHANNELS = 256
#: A pointwise 2-D conv (`is_pointwise`, one group, vb > 1, more than one position) is computed over the flattened
#: positions p = h * W + w of the image as [O, P] = W[O, C] x X[C, P] (``dt_conv_pwp``): a register tile of
#: `_PWP_ROWS` output channels x 2 vectors of positions, a weight value broadcast per multiply-add row, the input
#: and the result (and the epilogue: bias, activation, residual) read and written as whole vectors of NCHW - the
#: ``dt_conv_ocv`` tile stored its result one scalar per output, about the multiply-adds' cost at 16-24 input
#: channels. Where the tile does not divide H * W (checked at run time) the kernel schedules the block as
#: ``dt_conv_ocv`` over flattened positions instead (`cpu_schedule_conv._pointwise_select`: the partial tile, a
#: scalar loop, took up to 9x the channels form's time at 7 x 7). False: the ``dt_conv_ocv`` form (a switch for A/B).
POSITION_LANES = True
#: ... for convs of at most this many input and output channels (None: any). mobilenet_v3_small layer by layer
#: (`bench_layer_breakdown.py`, one thread, onnxruntime's time in the same process, this form against the switch
#: off): the layers at 56 x 56 and 28 x 28 (16-96 channels) 1.7-2.6x -> 1.0-1.4x, those at 14 x 14 (40-240) 1.0-1.8x
#: -> 0.9-1.7x, but at 7 x 7 (96 <-> 576, 288 -> 96: the channels form, 49 positions in 56) 1.05-1.43x -> 1.37-1.63x;
#: with hundreds of input channels the channels form's scalar stores are a small part of its time.
POSITION_LANES_MAX_CHANNELS = 256
#: ... and one of at least `PADDED_POSITIONS_MIN_CHANNELS` output channels whose plane H * W is not statically a
#: multiple of the tile's positions (a symbolic size: checked at run time, where the tile did not divide H * W the
#: kernel fell back to ``dt_conv_ocv`` over flattened positions, its tile's result stored one scalar an output) reads
#: a copy of its input zero-extended to whole tiles of positions (the strided form's ``STRIDED_BLOCK`` with stride 1:
#: the GEMM reads whole vectors, no test, no fallback). The copy is about 1 / O of the multiply-adds, so only for
#: expanding convs: mobilenet_v3_small's 1x1 40 -> 240, 48 -> 144, 40 -> 120 at 14 x 14 (196 positions, 13 tiles and
#: 4), and 48 -> 288 (`PADDED_POSITIONS_MAX_CHANNELS`: channels form over flattened positions before). False: the
#: run-time choice as before (a switch for A/B).
PADDED_POSITIONS = True
PADDED_POSITIONS_MIN_CHANNELS = 120
#: ... and at most this many input and output channels (in place of POSITION_LANES_MAX_CHANNELS): 48 -> 288 at 14 x 14
#: 0.76x the channels form's time; 96 -> 576 at 7 x 7 1.09x (`bench_conv_variants.py --layers mobilenet`).
PADDED_POSITIONS_MAX_CHANNELS = 288
#: A strided pointwise 2-D conv (1x1, stride > 1, no padding, one group: resnet's downsampling convs) is computed as
#: ``dt_conv_pwp`` too, on a copy of its strided input positions (``STRIDED_BLOCK``: [N, C, rows, W] with zero rows
#: past H, stored flattened, so that the GEMM reads whole vectors of positions without a test; the copy is ~1 / O of
#: the multiply-adds). False: ``dt_conv_ocv`` per row, the strided input read as broadcasts (a switch for A/B).
#: resnet18's layers, one thread, against onnxruntime in one process (`bench_conv_variants.py --only 1x1 --variants
#: base,spwocv`): 64 -> 128 at 28 x 28 out 1.15x -> 0.86x, 128 -> 256 at 14 x 14 1.23x -> 1.03x, but 256 -> 512 at
#: 7 x 7 1.13x -> 1.41x (49 positions in 64: hence the bound below).
STRIDED_POSITION_LANES = True
#: ... for convs of at most this many input and output channels (None: any).
STRIDED_POSITION_LANES_MAX_CHANNELS = 256
#: Output channels of the ``dt_conv_pwp`` register tile (the largest dividing O); positions: 2 vectors. The
#: accumulator tile must stay under TVM's 1024-byte stack limit (`kMaxStackAlloca`; at or above it every tile
#: is a TVMBackendAllocWorkspace call and no register tile): AVX2 4 x 16 floats (256 bytes, 8 of 16 ymm), AVX-512
#: 6 x 32 (768 bytes, 12 of 32 zmm; 8 x 32 was 1024 bytes: a workspace a tile).
_PWP_ROWS = {256: 4, 512: 6}
#: ... and vectors of positions.
_PWP_VECTORS = 2


@functools.lru_cache(maxsize=None)
def _host_vector_bits() -> int:
    """The vector registers' width LLVM compiles for on this CPU (the CPU target is always the host,
    `cpu_schedule.cpu_target`): 512 with AVX-512 (32 registers), else 256 (AVX2: 16). From the target's CPU
    features: TVM's ``llvm_get_vector_width`` says 512 for every x86 -mcpu here, AVX2-only ones included."""
    import tvm
    from tvm.target import codegen
    try:
        features = {str(f) for f in codegen.llvm_get_cpu_features(tvm.target.Target.from_device(tvm.cpu()))}
    except Exception:  # noqa: BLE001 - an LLVM without the query: the narrower registers (a smaller tile)
        return 256
    return 512 if "avx512f" in features else 256


#: Independent accumulators that keep the FMA units busy (2 FMA pipes x 4 cycles' latency on Zen 3 / 4): a tile
#: with fewer takes about as long as one with this many (`row_tile`).
_LATENCY_ACCUMULATORS = 8


#: Accumulator registers of the per-row ``dt_conv_ocv`` register tile on AVX2 (blocks of 16 channels: two registers)
#: of a 2-D conv of stride 1 along the row and several taps in a kernel row (a 3x3): 10 - 16 channels x 5 positions.
#: The 4 positions of `_ACC_REGISTERS` (8 accumulators) are the FMAs' latency x throughput exactly: each of the 8
#: chains gets 9 FMAs an input channel, and any stall (a load) leaves the FMA units idle. Neighbouring positions share
#: their taps' broadcast inputs, so LLVM loads each input value once for the tile's taps (2 + 3 + ... registers beside
#: the accumulators: 6 positions, 12 accumulators, took 1.02x the time of 4). resnet18's 64-channel 3x3 layers at
#: 56 x 56 (a symbolic 56-wide row: 12 ragged tiles of 5, 60 positions, against 14 of 4), one thread, thread CPU
#: time, the minimum of 30 interleaved blocks (`python benchmarks/bench_conv_variants.py --variants base,t5` and
#: the kernels alone in one process): 0.967x, 0.982x, 0.970x and 0.984x the time of tiles of 4 in four runs (two with
#: the residual add). The strided layers stay at 4: the 3x3 / 2 64 -> 128 (28-wide rows) took 1.03x and 1.13x with 5
#: (its taps share no input: 2 columns apart). The model against 8 in one process (`bench_model_ab.py --ab
#: te_conv.ROW_ACC_REGISTERS_AVX2=8`): B1 0.99x, B8 0.98x. 8: the tile of 4 (a switch for A/B).
ROW_ACC_REGISTERS_AVX2 = 10


def _ocv_tiles(vb: int, dtype: str, shared_taps: bool = False) -> tuple[int, int, int, int]:
    """(largest, smallest divisor taken, ragged, latency-bound) row tiles of ``dt_conv_ocv`` for blocks of vb
    channels; the last: positions below which a tile takes as long as with that many (`row_tile`). `shared_taps`:
    a 2-D conv of stride 1 along the row with several taps in a kernel row (`ROW_ACC_REGISTERS_AVX2`)."""
    bits = _host_vector_bits()
    lanes = max(1, bits // DataType(dtype).bits)
    regs = max(1, vb // lanes)
    accumulators = _ACC_REGISTERS[bits]
    if shared_taps and bits == 256 and regs == 2 and ROW_ACC_REGISTERS_AVX2:
        accumulators = ROW_ACC_REGISTERS_AVX2
    largest = max(1, accumulators // regs)
    return largest, max(2, largest // 3), min(8, largest), min(largest, max(1, _LATENCY_ACCUMULATORS // regs))


def _flat_tile(vb: int, dtype: str) -> int:
    """Output positions of the register tile of ``dt_conv_ocv`` over flattened positions: with two AVX2 registers
    of channels (vb 16 fp32) `FLAT_ACC_REGISTERS_AVX2` / 2; else (AVX-512, one register of channels) `_ocv_tiles`'
    ragged tile, as before (not measured with more)."""
    tiles = _ocv_tiles(vb, dtype)
    bits = _host_vector_bits()
    if bits == 256 and vb // max(1, bits // DataType(dtype).bits) == 2:
        return max(1, FLAT_ACC_REGISTERS_AVX2 // 2)
    return tiles[2]


def out_channel_block(out_per_group: int, cin_per_group: int, groups: int) -> int:
    """The output-channel block `vb` of ``dt_conv_ocv`` (16 fp32 lanes: one AVX-512 register, two AVX2
    ones), or 1: the spatial-vectorized form (depthwise, or a group's output channels not a multiple of 8)."""
    if (cin_per_group == 1 and groups > 1) or out_per_group < 8:
        return 1
    return next((vb for vb in (16, 8) if out_per_group % vb == 0), 1)


#: Output-channel blocks of a conv with one output position (a 1x1 conv on [N, C, 1, 1]: the squeeze-excitation's
#: GEMVs), largest dividing O first: its register tile is one position x vb channels, so vb 16 was 2 AVX2 accumulators
#: waiting on their FMAs' latency. () : `out_channel_block`'s 16 / 8 as for every conv (a switch for A/B).
GEMV_BLOCKS = (64, 32, 16, 8)


def gemv_channel_block(out_channels: int) -> int:
    """vb of ``dt_conv_ocv`` for a dense conv with one output position: the largest of GEMV_BLOCKS dividing
    `out_channels` (a multiple of 8: `out_channel_block` returned more than 1)."""
    return next((b for b in GEMV_BLOCKS if out_channels % b == 0), out_channel_block(out_channels, 2, 1))


def pack_axes(n_sp: int) -> list:
    """permute_dims axes from [O / vb, vb, Cg, *K] to [O / vb, Cg, *K, vb]."""
    return [0] + list(range(2, 3 + n_sp)) + [1]


def row_tile(width, tiles: tuple) -> tuple[int, bool]:
    """(tile, exact) for a row of `width` output positions (an int, or a symbolic PrimExpr), `tiles` (largest,
    smallest, ragged[, latency]): the whole row when it fits, else its largest divisor up to `largest` if not
    below `smallest`; else (ragged, False). With `latency` (``dt_conv_ocv``: a tile of fewer positions than that
    waits on its FMAs' latency, taking as long as one of `latency`), a static row takes the tile of least
    estimated time - tiles x max(tile, latency) - whole tiles of `ragged` included: on AVX2 (4 positions, all
    latency-bound) a 14-wide row took exact tiles of 2 (7 tiles), 1.4x slower than ragged ones of 4 (4 tiles,
    16 positions; resnet18's 256-channel 3x3 layers at 14 x 14, static sizes)."""
    largest, smallest, ragged = tiles[:3]
    latency = tiles[3] if len(tiles) > 3 else None
    if isinstance(width, tirx.IntImm):
        width = int(width.value)
    if isinstance(width, int):
        if width <= largest:
            return width, True
        if latency is not None:
            def cost(t):
                return -(-width // t) * max(t, latency)
            exact = max((d for d in range(1, largest + 1) if width % d == 0), key=lambda d: (-cost(d), d))
            return (exact, True) if cost(exact) <= cost(ragged) else (ragged, False)
        best = max(d for d in range(1, largest + 1) if width % d == 0)
        if best >= smallest:
            return best, True
    return ragged, False


def flat_positions(out, vb: int, dtype: str, reduction: int, pointwise: bool = False, channels: int = 0) -> bool:
    """Whether `te_conv` computes a conv of output sizes `out` and `reduction` multiply-adds per output over
    flattened positions (`FLAT_POSITIONS`); `pointwise`: a 1x1 kernel, stride 1, no padding (`FLAT_POINTWISE`)."""
    return (FLAT_POSITIONS and vb > 1 and len(out) >= 2
            and (reduction >= FLAT_MIN_REDUCTION or (FLAT_POINTWISE and pointwise and (
                FLAT_POINTWISE_MAX_CHANNELS is None or channels <= FLAT_POINTWISE_MAX_CHANNELS)))
            and not row_tile(out[-1], _ocv_tiles(vb, dtype))[1])


def is_pointwise(kernel, strides, pads) -> bool:
    """A 1x1 (1x1x1, ...) kernel, stride 1, no padding: each output position reads its own input position."""
    return all(int(k) == 1 for k in kernel) and all(int(s) == 1 for s in strides) and not any(
        lo or hi for lo, hi in pads)


#: op_pattern (Relax's AnnotateTIROpPattern, which keeps one already set) of a flat conv's kernel: kOutEWiseFusable,
#: as the per-row form is found to be. The analysis finds the flat form opaque (its crop stage reads the result at
#: h * W + w, not elementwise), which kept the bias / activation / residual add out of the kernel.
OUT_EWISE_FUSABLE = 4


def _padded(x, pads, last_span=None, guard=None, split_columns=False):
    """x zero-padded; `last_span`: the extent of the last axis instead of its padded size (whole ragged tiles);
    `guard`: a 1-element int64 tensor (always 0) of a run-time size check, read in the copy's condition
    (`_guarded`) so that the check runs first. `split_columns`: the column bounds marked ``likely`` (TIR's
    LoopPartition splits the column loop into padding and interior, as `SPLIT_PHASES`), the block named
    ``PAD_BLOCK + SPLIT_SUFFIX`` (`cpu_schedule_depthwise.schedule_phases` schedules it)."""
    if not any(lo or hi for lo, hi in pads) and last_span is None and guard is None:
        return x
    zero = tirx.const(0, x.dtype) if guard is None or GUARD_IN_CONDITION else tirx.Cast(x.dtype, guard[0])
    shape = list(x.shape[:2]) + [x.shape[2 + i] + _i64(lo + hi) for i, (lo, hi) in enumerate(pads)]
    if last_span is not None:
        shape[-1] = last_span

    def value(n, c, *p):
        src = [p[i] - _i64(lo) for i, (lo, _) in enumerate(pads)]
        bounds = [tirx.all(s >= _i64(0), s < x.shape[2 + i]) for i, s in enumerate(src)]
        if split_columns:
            bounds = _likely_bounds(bounds, src, x)
        inside = tirx.all(*bounds, *_guarded(guard))
        return tirx.if_then_else(inside, x(n, c, *src), zero)
    return te.compute(shape, value, name=PAD_BLOCK + (SPLIT_SUFFIX if split_columns else ""))


def _likely_bounds(bounds: list, src: list, x) -> list:
    """A split padded copy's bounds tests (`SPLIT_PHASES`, `SPLIT_SPV_PADDING`): the columns' marked ``likely`` (TIR's
    LoopPartition splits the column loop into padding and interior), and with `SPLIT_ROWS` the rows' too (the row
    loop split into the padding rows and the interior ones, whose columns then test nothing)."""
    marked = range(len(bounds)) if SPLIT_ROWS else [len(bounds) - 1]
    return [tirx.all(tirx.likely(src[i] >= _i64(0)), tirx.likely(src[i] < x.shape[2 + i])) if i in marked else b
            for i, b in enumerate(bounds)]


def _guarded(guard) -> list:
    """The guard's test (``guard[0] == 0``, always true) for a padded copy's condition, or none. Read in the
    condition - evaluated for every element - not as the padding value: a load only in the padding's branch is
    not hoisted out of the loop, and the copy was then a scalar loop of one branch per element (the stem conv of
    mobilenet_v3_small: ~40% of its time); now LLVM hoists it and vectorizes the copy."""
    return [] if guard is None or not GUARD_IN_CONDITION else [guard[0] == tirx.IntImm(guard.dtype, 0)]


def _padded_phases(x, pads, stride: int, last_span=None, guard=None):
    """x zero-padded (as `_padded`), its last axis stored as `stride` phases: [N, C, *rows, stride, ceil(span /
    stride)], column p * stride + phase at [..., phase, p]. A strided row tile of the spatial-vectorized form then
    reads each tap's inputs as one contiguous vector (column w * stride + r is [r % stride, w + r // stride]), not
    `stride`-apart lanes gathered one by one (mobilenet_v3_small's stride-2 depthwise layers: ~5 GFLOP/s)."""
    zero = tirx.const(0, x.dtype) if guard is None or GUARD_IN_CONDITION else tirx.Cast(x.dtype, guard[0])
    channels = int(x.shape[1]) if isinstance(x.shape[1], (int, tirx.IntImm)) else None
    rows = [x.shape[2 + i] + _i64(lo + hi) for i, (lo, hi) in enumerate(pads[:-1])]
    span = x.shape[-1] + _i64(pads[-1][0] + pads[-1][1]) if last_span is None else last_span
    shape = list(x.shape[:2]) + rows + [_i64(stride), tirx.floordiv(span + _i64(stride - 1), _i64(stride))]

    def value(n, c, *p):
        src = [p[i] - _i64(lo) for i, (lo, _) in enumerate(pads[:-1])]
        src.append(p[-1] * _i64(stride) + p[-2] - _i64(pads[-1][0]))
        bounds = [tirx.all(s >= _i64(0), s < x.shape[2 + i]) for i, s in enumerate(src)]
        if SPLIT_PHASES and not (isinstance(channels, int) and channels >= SPLIT_PHASES_MAX_CHANNELS):
            bounds = _likely_bounds(bounds, src, x)
        inside = tirx.all(*bounds, *_guarded(guard))
        return tirx.if_then_else(inside, x(n, c, *src), zero)
    return te.compute(shape, value, name=PHASES_BLOCK)


def position_lanes(in_sizes, out, kernel, strides, pads, groups: int, vb: int, channels: int,
                   out_channels: int | None = None, dtype: str = "float32") -> bool:
    """Whether `te_conv` computes the conv as ``dt_conv_pwp`` (`POSITION_LANES`): a pointwise 2-D conv of one
    group, at most POSITION_LANES_MAX_CHANNELS input and output `channels` (the larger of the two; for one that
    reads the copy extended to whole tiles, `padded_positions` of its `out_channels`, PADDED_POSITIONS_MAX_CHANNELS)
    and more than one position whose output sizes are its input's (the same vars: the flattened input index is then
    h * W + w of the output's)."""
    most = POSITION_LANES_MAX_CHANNELS
    if most is not None and out_channels is not None and padded_positions(out, out_channels, dtype):
        most = max(most, PADDED_POSITIONS_MAX_CHANNELS)
    return (POSITION_LANES and vb > 1 and groups == 1 and len(out) == 2
            and (most is None or channels <= most)
            and is_pointwise(kernel, strides, pads) and not all(_is_one(o) for o in out)
            and all(_same_size(a, b) for a, b in zip(in_sizes, out)))


def strided_position_lanes(out, kernel, strides, pads, groups: int, vb: int, channels: int) -> bool:
    """Whether `te_conv` computes the conv as ``dt_conv_pwp`` on a copy of its strided positions
    (`STRIDED_POSITION_LANES`): a 1x1 2-D conv of one group, a stride above 1, no padding, more than one output
    position, at most STRIDED_POSITION_LANES_MAX_CHANNELS input and output `channels` (the larger of the two)."""
    return (STRIDED_POSITION_LANES and vb > 1 and groups == 1 and len(out) == 2
            and (STRIDED_POSITION_LANES_MAX_CHANNELS is None or channels <= STRIDED_POSITION_LANES_MAX_CHANNELS)
            and all(int(k) == 1 for k in kernel) and any(int(s) > 1 for s in strides)
            and not any(lo or hi for lo, hi in pads) and not all(_is_one(o) for o in out))


def padded_positions(out, o_total: int, dtype: str) -> bool:
    """Whether a ``dt_conv_pwp`` conv (`position_lanes`) of `o_total` output channels reads its input from a copy
    extended to whole tiles (`PADDED_POSITIONS`): at least PADDED_POSITIONS_MIN_CHANNELS of them, and a plane not
    statically a multiple of the tile's positions."""
    if not PADDED_POSITIONS or o_total < PADDED_POSITIONS_MIN_CHANNELS:
        return False
    tile = _pwp_tile(dtype, o_total)[1]
    if all(isinstance(o, (int, tirx.IntImm)) for o in out):
        return int(out[0]) * int(out[1]) % tile != 0
    return True


def _is_one(v) -> bool:
    return isinstance(v, (int, tirx.IntImm)) and int(v) == 1


def _same_size(a, b) -> bool:
    if isinstance(a, (int, tirx.IntImm)) and isinstance(b, (int, tirx.IntImm)):
        return int(a) == int(b)
    return tvm_ffi.structural_equal(a, b)


def _pwp_tile(dtype: str, o_total: int) -> tuple[int, int, int]:
    """The ``dt_conv_pwp`` register tile of a conv of `dtype` to `o_total` channels (`te_conv_pwp`): (vector lanes,
    positions: `_PWP_VECTORS` vectors, output channels: the largest up to `_PWP_ROWS` dividing `o_total`)."""
    lanes = max(1, _host_vector_bits() // DataType(dtype).bits)
    most = _PWP_ROWS[_host_vector_bits()]
    return lanes, _PWP_VECTORS * lanes, next(r for r in range(most, 0, -1) if o_total % r == 0)


def te_conv(x, w, strides, dilations, pads, out, groups: int, vb: int, guard=None):
    """conv of `x` [N, C, *S] with `w` (packed [O / vb, Cg, *K, vb] when vb > 1, else [O, Cg, *K]) to
    [N, O, *out], summed in x's dtype (the converter casts float16 to float32 first). `guard`: see `_padded`."""
    n_sp = len(strides)
    if vb > 1:
        o_total, cg, kernel = int(w.shape[0]) * vb, int(w.shape[1]), [int(k) for k in w.shape[2:2 + n_sp]]
    else:
        o_total, cg, kernel = int(w.shape[0]), int(w.shape[1]), [int(k) for k in w.shape[2:]]
    pwp_tile = _pwp_tile(str(x.dtype), o_total)
    if position_lanes(x.shape[2:], out, kernel, strides, pads, groups, vb, max(o_total, cg), o_total, str(x.dtype)):
        if padded_positions(out, o_total, str(x.dtype)):
            return te_conv_strided_pointwise(x, w, [1] * len(strides), out, vb, *pwp_tile[1:], guard)
        return te_conv_pointwise(x, w, out, vb, *pwp_tile, guard)
    if strided_position_lanes(out, kernel, strides, pads, groups, vb, max(o_total, cg)):
        return te_conv_strided_pointwise(x, w, strides, out, vb, *pwp_tile[1:], guard)
    shared_taps = len(strides) == 2 and int(strides[-1]) == 1 and kernel[-1] > 1
    tile, exact = row_tile(out[-1], _ocv_tiles(vb, str(x.dtype), shared_taps) if vb > 1 else _SPV_TILES)
    if flat_positions(out, vb, str(x.dtype), cg * functools.reduce(lambda a, b: a * b, kernel, 1),
                      is_pointwise(kernel, strides, pads), o_total):
        return _te_conv_flat(x, w, strides, dilations, pads, out, groups, vb, _flat_tile(vb, str(x.dtype)), guard)
    full = list(out)
    last_span = None
    if not exact:   # whole tiles: ceil(W / tile) * tile positions, the input read past its end as zeros
        full[-1] = tirx.floordiv(out[-1] + _i64(tile - 1), _i64(tile)) * _i64(tile)
        last_span = (full[-1] - _i64(1)) * _i64(strides[-1]) + _i64((kernel[-1] - 1) * dilations[-1] + 1)
    phased = (vb == 1 and strides[-1] > 1 and PHASED_STRIDES
              and not (STRIDED_LANES and strides[-1] <= STRIDED_LANES_MAX_STRIDE
                       and kernel[-1] <= STRIDED_LANES_MAX_TAPS))
    if vb > 1 and last_span is not None and not any(lo or hi for lo, hi in pads):
        # no padding, whole tiles: the positions past the row read its last input (their results are cut) instead
        # of a zero-extended copy of the whole input - for a strided 1x1 convolution that copy cost more than
        # the convolution (resnet18's 1x1 / 2 layers: 2-3x onnxruntime's time). The guard (0) is read in the bound.
        # Not for the spatial-vectorized form: there the clamped index would make its vector loads gathers.
        last = x.shape[-1] - _i64(1) + (guard[0] if guard is not None else _i64(0))

        def xp(n, c, *pos):
            return x(n, c, *pos[:-1], tirx.min(pos[-1], last))
    elif phased:
        st = strides[-1]
        phases = _padded_phases(x, pads, st, last_span, guard)

        def xp(n, c, *pos):
            # pos[-1] = w * st + rk * d (`value` below): phase (rk * d) % st, column w + (rk * d) // st
            w_out, tap = pos[-1]
            return phases(n, c, *pos[:-1], tirx.floormod(tap, _i64(st)), w_out + tirx.floordiv(tap, _i64(st)))
    else:
        xp = _padded(x, pads, last_span, guard, split_columns=vb == 1 and SPLIT_SPV_PADDING)
    og = o_total // groups
    rc = [te.reduce_axis((_i64(0), _i64(cg)), name="rc")] if cg > 1 else []
    rk = [te.reduce_axis((_i64(0), _i64(k)), name=f"rk{i}") for i, k in enumerate(kernel)]

    def value(n, o, *s):
        c_in = rc[0] if rc else _i64(0)
        if groups > 1:
            # vb divides og, so a vector of vb output channels lies in one group: written through o // vb (which
            # the schedule's split simplifies to the block index), the group is a scalar, not a per-lane gather
            group = tirx.floordiv(tirx.floordiv(o, _i64(vb)), _i64(og // vb)) if vb > 1 else tirx.floordiv(o, _i64(og))
            c_in = group * _i64(cg) + c_in
        pos = [s[i] * _i64(st) + rk[i] * _i64(d) for i, (st, d) in enumerate(zip(strides, dilations))]
        if phased:      # the last position as (output column, tap offset): `_padded_phases`
            pos[-1] = (s[-1], rk[-1] * _i64(dilations[-1]))
        w_c = rc[0] if rc else _i64(0)
        wv = (w[tirx.floordiv(o, _i64(vb)), w_c, *rk, tirx.floormod(o, _i64(vb))] if vb > 1
              else w[o, w_c, *rk])
        return te.sum(xp(n, c_in, *pos) * wv, axis=rc + rk)
    res = te.compute([x.shape[0], _i64(o_total)] + full, value, name=OCV_BLOCK if vb > 1 else SPV_BLOCK,
                     attrs={ROW_TILE_ATTR: tile})
    if exact:
        return res
    return te.compute([x.shape[0], _i64(o_total)] + list(out), lambda *i: res(*i), name=CROP_BLOCK)


def _te_conv_flat(x, w, strides, dilations, pads, out, groups: int, vb: int, tile: int, guard=None):
    """``dt_conv_ocv`` over the flattened positions of the last two output axes (`FLAT_POSITIONS`): the block is
    [N, O, *out[:-2], ceil(H * W / tile) * tile], position p at row p // W, column p % W of the plane; the positions
    past H * W read the last one's inputs (the index clamped: no extended copy of the input), and the crop stage
    reads the result back as [N, O, *out]. Every position of a tile is one broadcast input value, so a tile may
    span two rows."""
    n_sp = len(strides)
    o_total, cg, kernel = int(w.shape[0]) * vb, int(w.shape[1]), [int(k) for k in w.shape[2:2 + n_sp]]
    height, width = out[-2], out[-1]
    plane = height * width
    # no padding: the input read as it is, no copy (a strided 1x1 conv), the size check's guard (0) read in the clamp
    # of the position (`te_conv`'s unpadded form)
    unpadded = not any(lo or hi for lo, hi in pads)
    xp = x if unpadded else _padded(x, pads, None, guard)
    last_position = plane - _i64(1) + (guard[0] if unpadded and guard is not None else _i64(0))
    og = o_total // groups
    flat = tirx.floordiv(plane + _i64(tile - 1), _i64(tile)) * _i64(tile)
    rc = [te.reduce_axis((_i64(0), _i64(cg)), name="rc")] if cg > 1 else []
    rk = [te.reduce_axis((_i64(0), _i64(k)), name=f"rk{i}") for i, k in enumerate(kernel)]

    def value(n, o, *s):
        c_in = rc[0] if rc else _i64(0)
        if groups > 1:
            c_in = tirx.floordiv(tirx.floordiv(o, _i64(vb)), _i64(og // vb)) * _i64(cg) + c_in
        last = tirx.min(s[-1], last_position)
        sp = list(s[:-1]) + [tirx.floordiv(last, width), tirx.floormod(last, width)]
        pos = [sp[i] * _i64(st) + rk[i] * _i64(d) for i, (st, d) in enumerate(zip(strides, dilations))]
        w_c = rc[0] if rc else _i64(0)
        wv = w[tirx.floordiv(o, _i64(vb)), w_c, *rk, tirx.floormod(o, _i64(vb))]
        return te.sum(xp(n, c_in, *pos) * wv, axis=rc + rk)
    res = te.compute([x.shape[0], _i64(o_total)] + list(out[:-2]) + [flat], value, name=OCV_BLOCK,
                     attrs={ROW_TILE_ATTR: tile, FLAT_ATTR: 1})
    return te.compute([x.shape[0], _i64(o_total)] + list(out),
                      lambda n, o, *s: res(n, o, *s[:-2], s[-2] * width + s[-1]), name=CROP_BLOCK)
