"""`kassay serve --gpus`: which GPUs a host shows, and which of them each worker gets."""

from __future__ import annotations

import pytest

from kassay.cli.api import plan_gpus, visible_gpus


def test_visible_gpus_follow_cuda_visible_devices() -> None:
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    uuids = "GPU-8a1b,GPU-77ff"
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": uuids}) == ["GPU-8a1b", "GPU-77ff"]
    # CUDA hides everything from the first invalid entry on
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "1,-1,2"}) == ["1"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_plan_gpus() -> None:
    visible = ["4", "5", "6", "7"]  # CUDA_VISIBLE_DEVICES=4,5,6,7: positions count from there
    assert plan_gpus("all", visible) == visible
    assert plan_gpus("2", visible) == ["4", "5"]
    assert plan_gpus("0,3", visible) == ["4", "7"]
    assert plan_gpus("device=1", visible) == ["5"]
    assert plan_gpus("device=0,2", visible) == ["4", "6"]
    assert plan_gpus("all", []) == []
    for spec, why in (
        ("5", "4 GPU"),
        ("0", "device=0"),
        ("1,9", "no GPU 9"),
        ("1,1", "each GPU once"),
        ("a,b", "write all"),
    ):
        with pytest.raises(ValueError, match=why):
            plan_gpus(spec, visible)
