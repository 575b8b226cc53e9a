"""The worker's artifact cache: artifacts received from the API, checked against their sha256,
kept by digest, and installed (unpacked, never run) into one folder per digest.

    <root>/<digest>/<filename>     the artifact's bytes as received
    <root>/<digest>/site/          what the executor puts on sys.path: the wheel's files (or the
                                   module plus a .dist-info naming its `impls` entry point)

Installing runs no code of the artifact and installs no dependency: torch, triton, kassay and
everything else come from the worker's own environment. A wheel whose Requires-Dist this
environment does not satisfy (another torch pinned, a package missing) is refused with the
reasons.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from kassay.artifacts import ArtifactMeta, check_filename, inspect_artifact, safe_member
from kassay.errors import InvalidSpecError, PayloadTooLargeError

_DIGEST_CHARS = frozenset("0123456789abcdef")


class ArtifactRefused(InvalidSpecError):
    """The artifact cannot be installed on this worker (bad bytes, unmet requirements)."""


def _check_digest(digest: str) -> str:
    if len(digest) != 64 or not set(digest) <= _DIGEST_CHARS:
        raise InvalidSpecError(f"artifact digest {digest!r} is not a sha256 in lowercase hex")
    return digest


def unmet_requirements(requires: Iterable[str]) -> list[str]:
    """Requires-Dist lines this environment does not satisfy, each with why."""
    from packaging.requirements import InvalidRequirement, Requirement

    problems = []
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            problems.append(f"{line!r} cannot be read: {exc}")
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an optional extra, or another platform's requirement
        try:
            have = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            problems.append(f"needs {req} and the worker has no {req.name}")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            problems.append(f"needs {req} and the worker has {req.name} {have}")
    return problems


class ArtifactCache:
    """Artifacts by digest under `root`."""

    def __init__(self, root: Path, *, max_bytes: int) -> None:
        self.root = Path(root)
        self.max_bytes = max_bytes
        self.root.mkdir(parents=True, exist_ok=True)

    def _dir(self, digest: str) -> Path:
        return self.root / _check_digest(digest)

    def file(self, digest: str) -> Path | None:
        """The artifact's bytes on disk, or None when they are not here."""
        d = self._dir(digest)
        if not d.is_dir():
            return None
        files = [p for p in d.iterdir() if p.is_file() and p.suffix in (".whl", ".py")]
        return files[0] if len(files) == 1 else None

    def has(self, digest: str) -> bool:
        return self.file(digest) is not None

    def missing(self, digests: Iterable[str]) -> list[str]:
        return [d for d in digests if not self.has(d)]

    def put(self, digest: str, filename: str, chunks: Iterable[bytes]) -> tuple[int, bool]:
        """Keep an artifact whose bytes come in `chunks`: (size, whether it was here already).
        The bytes must hash to `digest`; nothing is kept otherwise."""
        _check_digest(digest)
        check_filename(filename)
        if self.has(digest):
            for _ in chunks:  # drain the stream
                pass
            return os.path.getsize(self.file(digest) or ""), True
        h = hashlib.sha256()
        size = 0
        tmp = Path(tempfile.mkdtemp(prefix=".incoming-", dir=self.root))
        try:
            with open(tmp / filename, "wb") as fh:
                for chunk in chunks:
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise PayloadTooLargeError(
                            f"artifact {digest[:12]} is over {self.max_bytes} bytes"
                        )
                    h.update(chunk)
                    fh.write(chunk)
            if h.hexdigest() != digest:
                raise ArtifactRefused(
                    f"artifact bytes hash to {h.hexdigest()}, not to the digest sent ({digest})"
                )
            try:
                tmp.rename(self._dir(digest))
            except OSError:  # a concurrent put of the same artifact won
                if not self.has(digest):
                    raise
                return size, True
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return size, False

    def install(self, digest: str) -> Path:
        """The folder to put on the executor's sys.path for this artifact, unpacked on first
        use (ArtifactRefused when it cannot be). Idempotent."""
        d = self._dir(digest)
        site = d / "site"
        if (d / ".installed").exists():
            return site
        path = self.file(digest)
        if path is None:
            raise ArtifactRefused(f"artifact {digest} is not on this worker")
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != digest:  # the cache was tampered with
            raise ArtifactRefused(f"artifact {digest[:12]} on disk no longer matches its digest")
        meta = inspect_artifact(data, path.name)
        problems = unmet_requirements(meta.requires)
        if problems:
            raise ArtifactRefused(
                f"artifact {path.name} ({digest[:12]}) does not fit this worker: "
                + "; ".join(problems)
                + ". Artifacts are installed without dependencies: torch, triton and kassay "
                "come from the worker's environment, so require them without pinning other "
                "versions"
            )
        tmp = Path(tempfile.mkdtemp(prefix=".site-", dir=d))
        try:
            if meta.kind == "wheel":
                _unpack_wheel(path, tmp)
            else:
                _install_module(data, meta, tmp)
            for p in [tmp, *tmp.rglob("*")]:  # readable by the sandbox's user, writable by none
                p.chmod(0o555 if p.is_dir() else 0o444)
            try:
                tmp.rename(site)
            except OSError:
                if not site.is_dir():
                    raise
        finally:
            if tmp.exists():
                _make_writable(tmp)
                shutil.rmtree(tmp, ignore_errors=True)
        (d / ".installed").touch()
        return site


def _make_writable(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        if p.is_dir():
            p.chmod(0o755)


def _unpack_wheel(path: Path, target: Path) -> None:
    """A wheel's files into `target` as pip would lay out purelib/platlib (scripts, headers and
    data files are left out: nothing but importable code is needed)."""
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            name = info.filename
            if not safe_member(name) or name.endswith("/"):
                continue
            top, _, rest = name.partition("/")
            if top.endswith(".data"):
                kind, _, inner = rest.partition("/")
                if kind not in ("purelib", "platlib") or not inner:
                    continue
                name = inner
            dest = target / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)


def _install_module(data: bytes, meta: ArtifactMeta, target: Path) -> None:
    """A single module plus the .dist-info that names its `impls` as a kassay.impls entry
    point, so that it loads exactly as a wheel does."""
    (target / f"{meta.name}.py").write_bytes(data)
    info = target / f"{meta.name}-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta.name}\nVersion: 0\n")
    lines = "".join(f"{k} = {v}\n" for k, v in meta.entry_points.items())
    (info / "entry_points.txt").write_text(f"[kassay.impls]\n{lines}")
