"""Triton's CPU interpreter, as the engine must know it: which calls ran a Triton kernel under
it, and where in the kernel an error was raised.

On a CPU worker (TRITON_INTERPRET=1) every Triton kernel, kassay's or uploaded, runs under the
interpreter, which rounds float32 to bfloat16 toward zero (a -0.27% scale the bias check rightly
sees) and computes `tl.dot` on bfloat16 operands wrongly (seen with triton 3.9.0). Those are the
interpreter's errors, not the kernel's: the engine reports a bfloat16 case of a call that
launched a Triton kernel on the CPU as `skipped` (not judged on this device) instead of judging
it. Rounding the interpreter's stores to nearest instead would mean patching its private cast
helpers, and its `tl.dot` would still be wrong.

Launches are counted by wrapping the interpreter's grid executor (`GridExecutor.__call__`, the
one entry every interpreted launch goes through since triton 2.2); where a Triton version lacks
it, `launch_counter_installed()` is False and a unit test fails, so an upgrade cannot silently
turn the guard off.
"""

from __future__ import annotations

import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

_lock = threading.Lock()
_installed = False
_launches = 0

#: why a case is not judged (its status is `skipped`)
NOT_JUDGED = (
    "not judged on this device: a Triton kernel ran under Triton's CPU interpreter in bfloat16, "
    "which rounds float32 to bfloat16 toward zero and computes tl.dot on bfloat16 wrongly; "
    "run this case on a GPU worker"
)


def interpreting() -> bool:
    """Whether Triton kernels launched in this process run under the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _install() -> bool:
    global _installed
    if _installed:
        return True
    mod = sys.modules.get("triton.runtime.interpreter")
    if mod is None:
        return False
    grid = getattr(mod, "GridExecutor", None)
    if not isinstance(grid, type):
        return False
    with _lock:
        if _installed:
            return True
        original: Callable[..., Any] = grid.__call__

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            global _launches
            _launches += 1
            return original(self, *args, **kwargs)

        grid.__call__ = counted  # type: ignore[method-assign]
        _installed = True
    return True


def launch_counter_installed() -> bool:
    """Install the launch counter if the interpreter is loaded; whether it is in place."""
    return _install()


def launches() -> int:
    """Interpreted Triton launches so far in this process (0 until the interpreter loads)."""
    _install()
    return _launches


def where(exc: BaseException) -> str:
    """' (at file:line)' of the deepest frame of `exc`'s traceback outside Triton's own package,
    so an error raised inside the interpreter names the kernel's line, not interpreter.py."""
    tb = traceback.extract_tb(exc.__traceback__)
    if not tb:
        return ""
    triton = sys.modules.get("triton")
    root = os.path.dirname(triton.__file__) + os.sep if triton and triton.__file__ else None
    frame = tb[-1]
    if root is not None:
        # Triton's frames, and this module's launch counter, are not where the error is
        outside = [f for f in tb if not f.filename.startswith(root) and f.filename != __file__]
        if outside:
            frame = outside[-1]
    return f" (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})"
