"""benchmarks/bench_conv_variants.py: every variant names module constants that exist (so that renaming one
fails here, not in a benchmark run), the weight-packing variant keeps the packing rules of the shipped one
(depthwise and groups off 8 unpacked), and an unknown variant is a clear usage error."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_conv_variants as bcv  # noqa: E402


def test_variants_name_existing_constants():
    known = bcv.variants()
    assert "base" in known and not known["base"]
    for name, knobs in known.items():
        for (module, attr), value in knobs.items():
            assert hasattr(module, attr), (name, module.__name__, attr)
            # None: a limit switched off (e.g. FLAT_POINTWISE_MAX_CHANNELS)
            assert type(value) is type(getattr(module, attr)) or callable(value) or value is None, (name, attr)


def test_vb8_packing_rule():
    from dyntvm.codegen.te_conv import out_channel_block
    for og, cg, groups in [(64, 64, 1), (8, 8, 1), (24, 3, 1), (1, 1, 32), (16, 1, 16), (6, 4, 2), (12, 3, 4)]:
        want = 1 if out_channel_block(og, cg, groups) == 1 else 8
        assert bcv._vb8(og, cg, groups) == want, (og, cg, groups)


def test_unknown_variant_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        bcv.main(["--variants", "base,nonsense"])
    assert exc.value.code == 2
    assert "unknown variants ['nonsense']" in capsys.readouterr().err
