"""Test-only impls that misbehave on purpose, to prove the worker's crash isolation.

Registered for every op with kind "testing", so they are hidden unless asked for:
`kassay.impls.load(testing=True)`, which the worker does with --enable-test-impls or
KASSAY_ENABLE_TEST_IMPLS=1.

- `crash`: dereferences a null pointer through ctypes (SIGSEGV; os._exit(139) where the fault
  does not kill the process).
- `exit`: leaves the process with os._exit(3), as a library calling exit() would.
- `hang`: sleeps forever (holding the GIL only while it wakes up), like a deadlocked kernel.
- `raise`: raises RuntimeError, like any buggy impl.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any, NoReturn

from kassay.impls.registry import Impl, register

Tensors = dict[str, Any]

EXIT_CODE = 3


def _segfault(_inputs: Tensors, _params: Any) -> NoReturn:
    ctypes.string_at(0)  # reads address 0: SIGSEGV
    os._exit(139)  # pragma: no cover - only where the read did not fault


def _exit(_inputs: Tensors, _params: Any) -> NoReturn:
    os._exit(EXIT_CODE)


def _hang(_inputs: Tensors, _params: Any) -> NoReturn:
    while True:
        time.sleep(3600)


def _raise(_inputs: Tensors, _params: Any) -> NoReturn:
    raise RuntimeError("the testing impl 'raise' raised on purpose")


_IMPLS = {
    "crash": (_segfault, "test only: segfaults the executor (SIGSEGV via ctypes)"),
    "exit": (_exit, f"test only: exits the executor with os._exit({EXIT_CODE})"),
    "hang": (_hang, "test only: never returns (sleeps forever)"),
    "raise": (_raise, "test only: raises RuntimeError"),
}

for _op in ("flce", "lse_merge"):
    for _name, (_run, _desc) in _IMPLS.items():
        register(Impl(_op, _name, _run, _desc, kind="testing"), replace=True)
