"""bench/verdicts.py's sorting of a correct impl's failures: what is a known finding of a
third-party impl (with its evidence), what today's adapter declares unsupported, and what stays a
false failure. The committed H200 tables were sorted again with --reclassify."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

verdicts = importlib.import_module("verdicts")  # bench/verdicts.py: must import here

BF16 = "N=45,H=40,V=200,dtype=bfloat16,bias=False,autocast=none,reduction=mean"
TAIL = (
    ",ignore_index=-100,ignore_fraction=0.1,label_smoothing=0.0,softcap=None,z_loss_scale=0.0,"
    "return_z_loss=False,ce_weight=False,accum_dtype=None,use_token_scaling=False,"
    "return_token_accuracy=False"
)


def test_known_findings_need_their_evidence() -> None:
    kf = verdicts.known_finding
    assert kf("cce", "all_ignored", f"flce.cce {BF16}", "ZeroDivisionError: division by zero")
    assert kf("cce", "all_ignored", f"flce.cce {BF16}", "loss: 3 NaN/Inf element(s)") is None
    assert kf("torch_native", "all_ignored", "x", "loss: NaN")
    z_only = "z_loss: max_abs 8.8e-05 > 6.9e-07; rel_l2 0.0026 > 1.9e-05 (2 x baseline)"
    assert kf("liger", "normal", f"flce.liger {BF16}", z_only)
    # the same message in float32 is not explained by a 16-bit buffer
    assert (
        kf("liger", "normal", f"flce.liger {BF16.replace('bfloat16', 'float32')}", z_only) is None
    )
    # another output failing too: not only the z-loss buffer, stays a false failure
    both = z_only + "; grad_input: grad_input biased by -0.33%"
    assert kf("liger", "normal", f"flce.liger {BF16}", both) is None
    assert kf("kassay", "all_ignored", f"flce.kassay {BF16}", "ZeroDivisionError") is None
    # CCE's bf16 grad_input: 4-6x eager's error, measured with and without its filter
    gx = "grad_input: max_abs 1.81e-07 > 1.53e-07; rel_l2 0.0126 > 0.00636 (2 x baseline + {})"
    assert kf("cce", "normal", f"flce.cce {BF16}", gx.format("rounding floor"))
    assert kf("kassay", "normal", f"flce.kassay {BF16}", gx.format("rounding floor")) is None
    far = gx.replace("0.0126", "0.0300").format("rounding floor")  # 9x eager's: not this
    assert kf("cce", "normal", f"flce.cce {BF16}", far) is None
    biased = gx.format("rounding floor") + "; grad_input biased by -0.9%"
    assert kf("cce", "normal", f"flce.cce {BF16}", biased) is None
    f32 = f"flce.cce {BF16.replace('bfloat16', 'float32')}"
    assert kf("cce", "normal", f32, gx.format("rounding floor")) is None


def test_reclassify_sorts_a_stored_table_again(tmp_path: Path) -> None:
    f32_case = f"flce.cce {BF16.replace('bfloat16', 'float32')}{TAIL} [normal seed=0]"
    entries = [
        {"case": f"flce.cce {BF16}{TAIL} [all_ignored seed=0]", "status": "error",
         "flags": [], "message": "ZeroDivisionError: division by zero (at cce.py:94)"},
        {"case": f32_case, "status": "error", "flags": [],
         "message": "AssertionError: Backwards requires embeddings to be bf16 or fp16"},
        {"case": f"flce.liger {BF16}{TAIL} [normal seed=0]", "status": "failed", "flags": [],
         "message": "loss: max_abs 0.00062 > 0.000257; rel_l2 0.000107 > 4.26e-05"},
    ]  # fmt: skip
    stored = {
        "false_failures": [
            {
                "spec": "examples/h200.yaml",
                "per_impl": {
                    "flce.cce": {"cases": 3, "false_failures": 2},
                    "flce.liger": {"cases": 5, "false_failures": 1},
                },
                "false_failures": entries,
                "real_findings": [],
            }
        ]
    }
    path = tmp_path / "v.json"
    path.write_text(json.dumps(stored))
    verdicts.reclassify(path)
    ff = json.loads(path.read_text())["false_failures"][0]
    assert [e["case"].split()[0] for e in ff["false_failures"]] == ["flce.liger"]
    assert "lse.numel" in ff["real_findings"][0]["why"]
    assert "bfloat16 or float16" in ff["now_unsupported"][0]["why"]
    assert ff["per_impl"]["flce.cce"] == {"cases": 2, "false_failures": 0}
    assert ff["per_impl"]["flce.liger"] == {"cases": 5, "false_failures": 1}
    verdicts.reclassify(path)  # twice: the same table
    assert json.loads(path.read_text())["false_failures"][0] == ff
