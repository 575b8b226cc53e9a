"""The plugin-facing names of the impl registry (`Impl`, `register`, ...; the registry itself
lives beside the op loader, in `kassay.ops.registry`), the test-only impls (`testing`) and the
harness shims of the old import paths. The built-in impls live in each op's folder.

Importing this package registers nothing by itself; call `kassay.impls.load()` (the engine does).
"""

from kassay.ops.registry import Impl, get_impl, list_impls, load, load_with_corpora, register

__all__ = ["Impl", "get_impl", "list_impls", "load", "load_with_corpora", "register"]
