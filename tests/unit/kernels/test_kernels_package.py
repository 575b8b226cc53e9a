"""`kassay.kernels` as a library: its public names, the old import paths, and no service imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Top-level packages of the service's dependencies and kassay's own service layers: a training
# job that imports the kernels must not pay for (or need) any of them.
SERVICE_MODULES = (
    "fastapi",
    "starlette",
    "uvicorn",
    "grpc",
    "sqlalchemy",
    "pydantic",
    "pydantic_settings",
    "sse_starlette",
    "prometheus_client",
    "kassay_client",
    "kassay.api",
    "kassay.worker",
    "kassay.validate",
    "kassay.impls",
    "kassay.ops",
    "kassay.settings",
    "kassay.errors",
    "kassay.cli",
    "kassay.contract",
)

PUBLIC = [
    "DEFAULT_MEMORY_BUDGET_BYTES",
    "FlceConfig",
    "FlceOutput",
    "FusedLinearCrossEntropyLoss",
    "MergeConfig",
    "fused_linear_cross_entropy",
    "merge_state",
    "merge_state_",
    "merge_states",
    "plan_call",
]


def _loaded_after(code: str) -> list[str]:
    """Names in sys.modules after running `code` in a fresh interpreter."""
    script = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    env = {**os.environ, "TRITON_INTERPRET": os.environ.get("TRITON_INTERPRET", "1")}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def _service_modules(loaded: list[str]) -> list[str]:
    return [m for m in loaded if any(m == s or m.startswith(s + ".") for s in SERVICE_MODULES)]


def test_importing_the_kernels_imports_no_service_module():
    loaded = _loaded_after("from kassay.kernels import *  # noqa: F403")
    assert "kassay.kernels.flce" in loaded and "kassay.kernels.lse_merge" in loaded
    assert _service_modules(loaded) == []


def test_the_check_sees_a_service_import():
    # the same check on an import that does pull in the service's settings must fail
    loaded = _loaded_after("import kassay.kernels, kassay.settings")
    assert "kassay.settings" in _service_modules(loaded)


def test_public_names():
    import kassay.kernels as k

    assert sorted(k.__all__) == sorted(PUBLIC)
    for name in PUBLIC:
        assert getattr(k, name) is not None


def test_old_import_paths_keep_working():
    import kassay.kernels as k
    from kassay.kernels import flce, lse_merge

    assert flce.fused_linear_cross_entropy is k.fused_linear_cross_entropy
    assert flce.FusedLinearCrossEntropyLoss is k.FusedLinearCrossEntropyLoss
    assert flce.DEFAULT_MEMORY_BUDGET_BYTES == k.DEFAULT_MEMORY_BUDGET_BYTES == 470 * 2**20
    assert flce.FlceConfig is k.FlceConfig
    assert flce.FlceOutput is k.FlceOutput
    assert flce.plan_rows(8192, 128256, 2, flce.DEFAULT_MEMORY_BUDGET_BYTES) == 1792
    assert lse_merge.merge_states is k.merge_states and lse_merge.merge_state_ is k.merge_state_
    assert lse_merge.LaunchConfig is lse_merge.MergeConfig is k.MergeConfig
