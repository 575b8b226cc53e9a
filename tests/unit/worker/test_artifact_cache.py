"""Artifacts read without running them (what the API refuses at upload), the worker's cache
(digest check, install without dependencies, refused pins) and the executor protocol's guard
against a sandboxed executor that sends garbage."""

from __future__ import annotations

import io
import sys
import zipfile
from pathlib import Path

import pytest

from kassay.artifacts import inspect_artifact, sha256
from kassay.errors import InvalidSpecError
from kassay.worker.frames import MAX_FRAME_BYTES, Channel, ProtocolError
from kassay.worker.server.artifact_cache import ArtifactCache, ArtifactRefused, unmet_requirements

WHEEL = "demo_kernels-0.1-py3-none-any.whl"


def _wheel(
    *,
    requires: tuple[str, ...] = (),
    entry_points: str = "[kassay.impls]\ndemo = demo_kernels:impls\n",
    extra: dict[str, str] | None = None,
) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("demo_kernels/__init__.py", "def impls():\n    return []\n")
        meta = "Metadata-Version: 2.1\nName: demo-kernels\nVersion: 0.1\n"
        meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
        zf.writestr("demo_kernels-0.1.dist-info/METADATA", meta)
        zf.writestr("demo_kernels-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\n")
        if entry_points:
            zf.writestr("demo_kernels-0.1.dist-info/entry_points.txt", entry_points)
        for name, text in (extra or {}).items():
            zf.writestr(name, text)
    return buf.getvalue()


def test_a_wheel_is_read_for_its_entry_points_and_requirements() -> None:
    meta = inspect_artifact(_wheel(requires=("torch>=2",)), WHEEL)
    assert (meta.kind, meta.name, meta.version) == ("wheel", "demo-kernels", "0.1")
    assert meta.entry_points == {"demo": "demo_kernels:impls"}
    assert meta.requires == ["torch>=2"]


@pytest.mark.parametrize(
    ("data", "filename", "why"),
    [
        (_wheel(entry_points=""), WHEEL, "no \\[kassay.impls\\] entry point"),
        (_wheel(extra={"../evil.py": "x"}), WHEEL, "outside its root"),
        (b"not a zip", WHEEL, "not a zip"),
        (b"x = 1\n", "mod.py", "defines no top-level `impls`"),
        (b"def impls(:\n", "mod.py", "not valid Python"),
        (b"def impls(): pass\n", "../mod.py", "without folders"),
        (b"def impls(): pass\n", "my-mod.py", "identifier"),
    ],
)
def test_what_cannot_work_is_refused_at_upload(data: bytes, filename: str, why: str) -> None:
    with pytest.raises(InvalidSpecError, match=why):
        inspect_artifact(data, filename)


def test_a_module_stands_for_its_impls_entry_point() -> None:
    meta = inspect_artifact(b"from x import y\ndef impls():\n    return []\n", "mine.py")
    assert meta.kind == "module" and meta.entry_points == {"mine": "mine:impls"}


def test_requirements_are_checked_against_the_workers_environment() -> None:
    import torch

    have = torch.__version__.split("+")[0]
    assert unmet_requirements(["torch", f"torch>={have}", 'pytest; extra == "dev"']) == []
    (pinned,) = unmet_requirements(["torch==1.0.0"])
    assert "needs torch==1.0.0 and the worker has torch" in pinned
    (absent,) = unmet_requirements(["kassay-no-such-package-xyz"])
    assert "has no kassay-no-such-package-xyz" in absent


def test_the_cache_keeps_only_bytes_that_match_their_digest(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path, max_bytes=1 << 20)
    data = _wheel()
    with pytest.raises(ArtifactRefused, match="hash to"):
        cache.put("0" * 64, WHEEL, [data])
    assert cache.missing(["0" * 64]) == ["0" * 64]
    digest = sha256(data)
    assert cache.put(digest, WHEEL, [data[:10], data[10:]]) == (len(data), False)
    assert cache.put(digest, WHEEL, [data]) == (len(data), True)
    site = cache.install(digest)
    assert (site / "demo_kernels" / "__init__.py").is_file()
    assert (site / "demo_kernels-0.1.dist-info" / "entry_points.txt").is_file()
    assert cache.missing([digest]) == []  # still held once installed


def test_a_wheel_pinning_another_torch_is_refused_with_why(tmp_path: Path) -> None:
    cache = ArtifactCache(tmp_path, max_bytes=1 << 20)
    data = _wheel(requires=("torch==1.0.0",))
    digest = sha256(data)
    cache.put(digest, WHEEL, [data])
    with pytest.raises(ArtifactRefused, match=r"needs torch==1\.0\.0") as err:
        cache.install(digest)
    assert "without dependencies" in err.value.message


def test_the_executor_protocol_reads_json_only_within_a_size() -> None:
    msg = {"type": "result", "x": [1.5, float("inf")]}
    frame = Channel.encode(msg)
    assert Channel.decode(frame[4:]) == msg
    with pytest.raises(ProtocolError, match="not JSON"):
        Channel.decode(b"\x80\x04K\x01.")  # a pickle is not read
    with pytest.raises(ProtocolError, match="not a JSON object"):
        Channel.decode(b"[1]")
    with pytest.raises(ProtocolError, match="limit"):
        Channel.frame_size((MAX_FRAME_BYTES + 1).to_bytes(4, "big"))


def test_artifact_impls_load_as_plugins_do_but_take_no_taken_name(tmp_path: Path, monkeypatch):
    """In the executor: an artifact's impls are registered (kind `artifact`) from its installed
    folder; one that would take a built-in's name, and an entry point that raises, are left out
    and reported, and the built-in stays what it was."""
    from kassay.ops import registry
    from kassay.worker.executor.main import load_artifacts

    registry.load(plugins=False)
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(sys, "path", list(sys.path))
    builtin = registry.get_impl("lse_merge", "torch")
    clash = (
        "from kassay.impls import Impl\n"
        "def _run(inputs, params):\n    raise RuntimeError('never run')\n"
        "def impls():\n"
        "    return [Impl('lse_merge', 'torch', _run), Impl('lse_merge', 'mine_ok', _run)]\n"
    )
    broken = "def impls():\n    raise RuntimeError('broken at load')\n"
    cache = ArtifactCache(tmp_path, max_bytes=1 << 20)
    sites = []
    for name, text in (("kassay_clash.py", clash), ("kassay_broken.py", broken)):
        data = text.encode()
        cache.put(sha256(data), name, [data])
        sites.append(str(cache.install(sha256(data))))
    errors = load_artifacts(sites)
    assert len(errors) == 2, errors
    assert "impl 'torch' of op 'lse_merge' is already taken" in errors[0]
    assert "RuntimeError: broken at load" in errors[1]
    assert registry.get_impl("lse_merge", "mine_ok").kind == "artifact"
    assert registry.get_impl("lse_merge", "torch") is builtin
    sys.modules.pop("kassay_clash", None)  # the artifact's module stays test-local
