import json
import warnings

import pytest
import torch

from gh200rt.platform.detect import detect
from gh200rt.platform.bandwidth import load_measured_profile
from gh200rt.platform.profiles import PROFILES, get_profile

NAMES = ("gh200-96g", "gh200-144g", "h100-sxm", "h100-pcie", "h200", "cpu")


def test_all_named_profiles_exist_and_gh200_link_beats_pcie():
    assert set(NAMES) <= set(PROFILES)
    assert get_profile("gh200-96g").link_h2d_gbps > 5 * get_profile("h100-sxm").link_h2d_gbps
    assert get_profile("gh200-96g").ats and not get_profile("h100-sxm").ats


def test_unknown_profile_names_the_choices():
    with pytest.raises(ValueError, match="gh200-96g"):
        get_profile("a100")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_detect_on_cpu_returns_cpu_without_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plat = detect()
    assert plat.kind == "cpu" and plat.profile == "cpu" and not plat.ats


def test_named_profile_planning_without_hardware():
    plat = detect("gh200-96g")
    assert plat.kind == "gh200" and plat.device_memory_bytes == 96 * 10**9 and plat.ats


def test_measured_profile_overrides_fields(tmp_path):
    path = tmp_path / "measured.json"
    path.write_text(json.dumps({"link_h2d_gbps": 401.5}))
    plat = detect("gh200-96g", measured_profile=path)
    assert plat.link_h2d_gbps == 401.5 and plat.hbm_gbps == get_profile("gh200-96g").hbm_gbps
    path.write_text(json.dumps({"bogus": 1}))
    with pytest.raises(ValueError, match="bogus"):
        load_measured_profile(path, get_profile("cpu"))
