"""Artifacts: the code a job brings (a wheel, or a single-module .py file), named by the sha256 of
its bytes. This module reads one without running it (no import, no torch), for the API (refuse
what cannot work, at upload) and the worker (install it, kassay.worker.server.artifact_cache).

A wheel provides impls through its `kassay.impls` entry points, exactly as an installed plugin
does. A module `name.py` must define a top-level `impls` (a callable returning an Impl or a
list of them): it stands for the entry point `name = name:impls`.
"""

from __future__ import annotations

import ast
import configparser
import hashlib
import io
import re
import zipfile
from dataclasses import dataclass, field
from email.parser import HeaderParser
from typing import Literal

from kassay.errors import InvalidSpecError

ArtifactKind = Literal["wheel", "module"]
ENTRY_POINT_GROUP = "kassay.impls"
_FILENAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+\-]{0,200}\.(whl|py)$")
#: unpacked size and file count of a wheel (a small zip can expand without bound)
MAX_UNPACKED_BYTES = 1 << 30
MAX_FILES = 20_000


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class ArtifactMeta:
    """What an artifact says about itself."""

    kind: ArtifactKind
    name: str  # distribution name (the module name for a module)
    version: str
    requires: list[str] = field(default_factory=list)  # Requires-Dist lines
    entry_points: dict[str, str] = field(default_factory=dict)  # kassay.impls: name -> target
    dist_info: str = ""  # the wheel's .dist-info folder


def _refuse(message: str, **details: object) -> InvalidSpecError:
    return InvalidSpecError(message, details=dict(details))


def check_filename(filename: str) -> ArtifactKind:
    """`wheel` or `module` from a plain file name (no folders); InvalidSpecError otherwise."""
    if not _FILENAME.match(filename or ""):
        raise _refuse(
            f"artifact file name {filename!r} must be a wheel (NAME-VERSION-...whl) or a module "
            "(NAME.py) without folders",
            filename=filename,
        )
    if filename.endswith(".py"):
        if not filename[:-3].isidentifier():
            raise _refuse(f"module artifact {filename!r}: the name must be a Python identifier")
        return "module"
    if filename.count("-") < 4:
        raise _refuse(
            f"wheel artifact {filename!r}: a wheel is named NAME-VERSION-PYTAG-ABITAG-PLATFORM.whl"
        )
    return "wheel"


def safe_member(name: str) -> bool:
    """A zip member that unpacks inside its target folder."""
    if not name or name.startswith(("/", "\\")) or "\\" in name or ":" in name.split("/")[0]:
        return False
    return ".." not in name.split("/")


def inspect_artifact(data: bytes, filename: str) -> ArtifactMeta:
    """Read an artifact's kind, name, requirements and kassay.impls entry points without running
    any of it. InvalidSpecError (HTTP 422) names what is wrong."""
    kind = check_filename(filename)
    if kind == "module":
        return _inspect_module(data, filename)
    return _inspect_wheel(data, filename)


def _inspect_module(data: bytes, filename: str) -> ArtifactMeta:
    try:
        text = data.decode("utf-8")
        tree = ast.parse(text, filename=filename)  # parsing runs nothing
    except (UnicodeDecodeError, SyntaxError, ValueError) as exc:
        raise _refuse(f"module artifact {filename!r} is not valid Python: {exc}") from None
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.ImportFrom, ast.Import)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
    stem = filename[:-3]
    if "impls" not in defined:
        raise _refuse(
            f"module artifact {filename!r} defines no top-level `impls`: it must define "
            "impls() returning the Impl (or list of Impls) it provides"
        )
    return ArtifactMeta("module", stem, "0", entry_points={stem: f"{stem}:impls"})


def _inspect_wheel(data: bytes, filename: str) -> ArtifactMeta:
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = zf.infolist()
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise _refuse(f"wheel artifact {filename!r} is not a zip file: {exc}") from None
    if len(infos) > MAX_FILES:
        raise _refuse(
            f"wheel artifact {filename!r} has {len(infos)} files; the limit is {MAX_FILES}"
        )
    unpacked = sum(i.file_size for i in infos)
    if unpacked > MAX_UNPACKED_BYTES:
        raise _refuse(
            f"wheel artifact {filename!r} unpacks to {unpacked} bytes; the limit is "
            f"{MAX_UNPACKED_BYTES}"
        )
    bad = [i.filename for i in infos if not safe_member(i.filename)]
    if bad:
        raise _refuse(f"wheel artifact {filename!r} has paths outside its root: {bad[:3]}")
    dist_infos = {
        i.filename.split("/")[0]
        for i in infos
        if i.filename.split("/")[0].endswith(".dist-info") and "/" in i.filename
    }
    if len(dist_infos) != 1:
        raise _refuse(f"wheel artifact {filename!r} must hold one .dist-info folder")
    dist_info = dist_infos.pop()
    names = {i.filename for i in infos}
    try:
        meta_text = zf.read(f"{dist_info}/METADATA").decode("utf-8", "replace")
    except KeyError:
        raise _refuse(f"wheel artifact {filename!r} has no {dist_info}/METADATA") from None
    meta = HeaderParser().parsestr(meta_text)
    entry_points: dict[str, str] = {}
    ep_name = f"{dist_info}/entry_points.txt"
    if ep_name in names:
        parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
        parser.optionxform = str  # type: ignore[assignment,method-assign]
        try:
            parser.read_string(zf.read(ep_name).decode("utf-8", "replace"))
        except configparser.Error as exc:
            raise _refuse(f"wheel artifact {filename!r}: bad entry_points.txt: {exc}") from None
        if parser.has_section(ENTRY_POINT_GROUP):
            entry_points = dict(parser.items(ENTRY_POINT_GROUP))
    if not entry_points:
        raise _refuse(
            f"wheel artifact {filename!r} declares no [{ENTRY_POINT_GROUP}] entry point; add "
            f'[project.entry-points."{ENTRY_POINT_GROUP}"] to its pyproject.toml'
        )
    return ArtifactMeta(
        "wheel",
        str(meta.get("Name") or filename.split("-")[0]),
        str(meta.get("Version") or "0"),
        requires=[str(r) for r in meta.get_all("Requires-Dist") or []],
        entry_points=entry_points,
        dist_info=dist_info,
    )


__all__ = [
    "ENTRY_POINT_GROUP",
    "ArtifactKind",
    "ArtifactMeta",
    "check_filename",
    "inspect_artifact",
    "safe_member",
    "sha256",
]
