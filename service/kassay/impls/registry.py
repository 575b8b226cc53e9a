"""Deprecated import path of the impl registry, which lives beside the op loader now
(`kassay.ops.registry`). Plugins import `Impl` and `register` from `kassay.impls`; this module
keeps `from kassay.impls.registry import Impl, register` working, with a DeprecationWarning,
until the next major release."""

from __future__ import annotations

import warnings

from kassay.ops.registry import (
    Impl,
    RemoteRun,
    get_impl,
    list_impls,
    load,
    load_with_corpora,
    register,
    scoped,
)

warnings.warn(
    "kassay.impls.registry moved to kassay.ops.registry (plugins: import Impl and register "
    "from kassay.impls)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [
    "Impl",
    "RemoteRun",
    "get_impl",
    "list_impls",
    "load",
    "load_with_corpora",
    "register",
    "scoped",
]
