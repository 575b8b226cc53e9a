"""Test-only impls that misbehave on purpose, to prove the worker's crash isolation.

Registered for every op with kind "testing", so they are hidden unless asked for:
`kassay.impls.load(testing=True)`, which the worker does with --enable-test-impls or
KASSAY_ENABLE_TEST_IMPLS=1.

- `crash`: dereferences a null pointer through ctypes (SIGSEGV; os._exit(139) where the fault
  does not kill the process).
- `exit`: leaves the process with os._exit(3), as a library calling exit() would.
- `hang`: sleeps forever (holding the GIL only while it wakes up), like a deadlocked kernel.
- `raise`: raises RuntimeError, like any buggy impl.
- `slowable` (flce only): the `torch` impl, plus, when the executor's environment has
  KASSAY_TEST_EXTRA_PASS=F (a fraction), a deliberate second forward and backward pass over the
  first F of the rows (F over 1: whole passes, then the rest): the same results, about F
  slower. It rehearses a regression gate: a job
  run by a worker started with KASSAY_TEST_EXTRA_PASS=0.2 is a commit that made `slowable` 20%
  slower.
"""

from __future__ import annotations

import ctypes
import os
import time
from typing import Any, NoReturn

from kassay.ops.flce import harness as flce_harness
from kassay.ops.flce.baseline import flce_eager
from kassay.ops.registry import Impl, register

Tensors = dict[str, Any]

EXIT_CODE = 3
EXTRA_PASS_ENV = "KASSAY_TEST_EXTRA_PASS"


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


def _flce_slowable(x: Any, w: Any, target: Any, b: Any, p: Any) -> Any:
    out = flce_eager(x, w, target, b, p)
    left = float(os.environ.get(EXTRA_PASS_ENV) or 0)
    while left > 0:  # F over 1: whole passes over every row, then the rest
        rows = int(x.shape[0] * min(left, 1.0))
        left -= 1.0
        if not rows:
            break
        extra = flce_eager(x[:rows], w, target[:rows], b, p)
        extra_loss = extra[0] if isinstance(extra, tuple) else extra
        # Joined with weight 0: the backward runs the extra pass too, the results stay exact.
        if isinstance(out, tuple):
            out = (out[0] + 0.0 * extra_loss.sum(), *out[1:])
        else:
            out = out + 0.0 * extra_loss.sum()
    return out


register(
    Impl(
        "flce",
        "slowable",
        flce_harness.as_run(_flce_slowable),
        f"test only: torch, plus an extra pass over the first ${EXTRA_PASS_ENV} of the rows",
        kind="testing",
    ),
    replace=True,
)
