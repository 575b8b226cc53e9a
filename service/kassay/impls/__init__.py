"""Implementations of the ops: the registry and the built-in impls.

Importing this package registers nothing by itself; call `kassay.impls.load()` (the engine does).
"""

from kassay.impls.registry import Impl, get_impl, list_impls, load, load_with_corpora, register

__all__ = ["Impl", "get_impl", "list_impls", "load", "load_with_corpora", "register"]
