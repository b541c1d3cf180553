import json

import pytest

from gac.errors import GacError
from gac.hardware.profile import OPS, Profile, default_profile, load_profile


def test_default_profile_rules():
    p = default_profile()
    assert not p.measured and "NOT measured" in p.label
    for op in OPS:
        assert p.modulus(op) == 8 and p.prefer(op) == 16
        assert p.is_aligned(op, 112) and not p.is_aligned(op, 107)
        assert p.penalty(op, 107) > p.penalty(op, 112) >= 1.0
        assert p.repair_target(op, 107) == 112


def test_profile_roundtrip(tmp_path):
    p = default_profile("bfloat16")
    p.ops["gemm_n"].curve = {
        "dims": [1001, 1008],
        "ms": [2.0, 0.3],
        "efficiency": [0.15, 1.0],
        "tflops": [100.0, 678.0],
    }
    path = tmp_path / "p.json"
    p.save(path)
    q = load_profile(path)
    assert q.to_dict() == p.to_dict()
    assert q.efficiency("gemm_n", 1001) == pytest.approx(0.15)
    assert q.penalty("gemm_n", 1008) == pytest.approx(1.0)


def test_bad_profiles(tmp_path):
    with pytest.raises(GacError, match="no profile"):
        load_profile(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(GacError, match="not a gac profile"):
        load_profile(bad)
    with pytest.raises(GacError, match="no operator class"):
        default_profile().rule("conv")


def test_auto_profile_without_gpu_is_default():
    p = load_profile(None, gpu="Some Unknown GPU")
    assert isinstance(p, Profile) and not p.measured
