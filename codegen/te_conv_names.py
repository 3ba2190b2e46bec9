"""Names of the blocks and annotations of the conv computes (`te_conv`, `te_conv_pwp`), which the CPU conv
schedule (`backends/cpu/cpu_schedule_conv`) finds them by; `te_conv.X` is their public name."""
OCV_BLOCK = "dt_conv_ocv"
SPV_BLOCK = "dt_conv_spv"
PAD_BLOCK = "dt_conv_pad"
#: The padded input stored as phases (`te_conv._padded_phases`): a ``PAD_BLOCK`` whose last two axes are
#: (phase, column).
PHASES_BLOCK = "dt_conv_pad_phases"
CROP_BLOCK = "dt_conv_crop"
#: A pointwise 2-D conv vectorized along its positions (`te_conv.POSITION_LANES`, `te_conv_pwp`).
PWP_BLOCK = "dt_conv_pwp"
#: The strided positions of a strided pointwise conv (`te_conv.STRIDED_POSITION_LANES`), a ``PAD_BLOCK`` the schedule
#: stores flattened (`cpu_schedule_conv._strided_copy`).
STRIDED_BLOCK = PAD_BLOCK + "_strided"
#: Suffix of a ``PAD_BLOCK`` whose column loop is split into padding and interior (`te_conv._padded`'s `split_columns`).
SPLIT_SUFFIX = "_split"
#: Annotation of the conv block: the register tile's output positions along a row (`te_conv.row_tile`).
ROW_TILE_ATTR = "dt_conv_row_tile"
#: Annotation of a ``dt_conv_ocv`` block computed over the flattened positions of its last two output axes
#: (`te_conv.FLAT_POSITIONS`): its last axis is then h * W + w, whole tiles of ROW_TILE_ATTR positions.
FLAT_ATTR = "dt_conv_flat"
#: Annotation of a ``dt_conv_pwp`` block: the output channels of its register tile.
PWP_ROWS_ATTR = "dt_conv_pwp_rows"
