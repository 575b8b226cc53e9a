"""examples/op-plugin on CUDA: the RMSNorm op's Triton kernel is judged in bfloat16 too (the
Triton interpreter cannot be trusted there), beside the torch baseline, at every dtype and
regime, and its mutants are caught by `kassay selftest --device cuda`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

ROOT = Path(__file__).resolve().parents[2]
SPEC = {
    "name": "rmsnorm-plugin-gpu",
    "suites": [
        {
            "op": "rmsnorm",
            "impls": ["torch", "triton"],
            "params": {"N": [4096, 333], "H": [4096, 1000], "dtype": ["float32", "bfloat16"]},
        },
        {
            "op": "rmsnorm",
            "impls": ["torch", "triton"],
            "params": {"N": 2048, "H": 2048, "dtype": "float16"},
        },
    ],
}


def _kassay(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kassay.cli", *args],
        env={**env, "COLUMNS": "200"},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_plugin_op_on_cuda(tmp_path: Path) -> None:
    target = tmp_path / "site"
    src = tmp_path / "op-plugin"  # a copy: the build leaves build/ and *.egg-info behind
    shutil.copytree(ROOT / "examples" / "op-plugin", src)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(target), str(ROOT / "service"), str(ROOT / "client"), env.get("PYTHONPATH", "")]
    )
    (tmp_path / "spec.json").write_text(json.dumps(SPEC))
    ran = _kassay(
        env, tmp_path, "run", "spec.json", "--device", "cuda", "--quiet", "--json", "r.json"
    )
    report = json.loads((tmp_path / "r.json").read_text())
    bad = [
        (c["case_id"], c["status"], c["message"][:300])
        for c in report["cases"]
        if c["status"] != "passed"
    ]
    print(report["summary"])
    assert ran.returncode == 0 and not bad, bad
    dtypes = {c["params"]["dtype"] for c in report["cases"] if c["impl"] == "triton"}
    assert dtypes == {"float32", "bfloat16", "float16"}
    timed = [c for c in report["cases"] if c["impl"] == "triton" and c.get("timing")]
    assert timed, "the plugin's kernel was timed on the device"
    selftest = _kassay(
        env,
        tmp_path,
        "selftest",
        "--device",
        "cuda",
        "--only",
        "rmsnorm.m_grad_weight_unnormalised",
        "rmsnorm.m_mean_square_in_dtype",
    )
    assert "detected 2/2 mutants, false failures 0/" in selftest.stdout, selftest.stdout[-2000:]
