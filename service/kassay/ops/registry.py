"""The implementation registry, keyed by (op, name).

An impl is a callable `run(inputs, params) -> outputs` (dicts of tensors keyed by the op's input
and output names) plus a `supports(params, device) -> reason | None` predicate. Built-ins register
when `load()` imports each op's impl modules (`Op.impl_modules`, in the op's folder); third-party packages register through the entry-point group
`kassay.impls` (an entry point names a callable that takes no argument and returns an `Impl` or a
list of them). Mutants (the self-test's known-bug corpus) and test-only impls (crash, hang, raise)
live in the same registry under their own kinds and are hidden unless asked for. Impls of a job's
artifacts (kind "artifact") are registered in the sandboxed impl runner that loaded them
(kassay.worker.executor.main.load_artifacts), and in the trusted executor as proxies for the length
of one group (`scoped`).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Literal

import torch

from kassay.errors import UnknownImplError, did_you_mean

log = logging.getLogger(__name__)

Tensors = dict[str, torch.Tensor]
RunFn = Callable[[Tensors, Any], Tensors]
SupportsFn = Callable[[Any, torch.device], "str | None"]
Kind = Literal["builtin", "peer", "plugin", "mutant", "alternative", "testing", "artifact"]


def _always(_params: Any, _device: torch.device) -> str | None:
    return None


@dataclass
class RemoteRun:
    """What an impl that runs in another process (code a job brought, in the sandbox) handed
    back for one case: its outputs and a second run's (determinism), or why it did not run;
    its timing (a TimingStats dump) and peak memory, measured where it ran; the Triton kernels
    it launched under the CPU interpreter."""

    outputs: Tensors | None = None
    second: Tensors | None = None
    timing: dict[str, Any] | None = None
    timing_error: str = ""
    peak_bytes: int | None = None
    ms: float = 0.0
    error: str | None = None
    #: the process died running it (the error says how)
    crashed: bool = False
    unsupported: str | None = None
    interpreted: int = 0


#: (inputs, params, timing policy dump or None, capture key) -> RemoteRun
RemoteFn = Callable[[Tensors, Any, "dict[str, Any] | None", str], RemoteRun]


@dataclass(frozen=True)
class Impl:
    """One implementation of one op.

    run: computes every output of the op for `params` from `inputs` (the op's generated inputs,
    which it must not modify). supports: returns None, or the reason these params/device cannot
    be run (reported as status `unsupported`). bug: for mutants, the known bug reproduced.
    nondeterministic: the impl may give different bits on two runs of the same inputs (e.g.
    atomics): its run-to-run spread is reported and must stay within the tolerance, instead of
    any difference failing the case.
    """

    op: str
    name: str
    run: RunFn
    description: str = ""
    supports: SupportsFn = _always
    kind: Kind = "builtin"
    bug: str | None = None
    exposes: tuple[str, ...] = field(default=())  # selftest: regimes that expose a mutant
    nondeterministic: bool = False
    #: set for an impl whose code runs in another process (kassay.worker.executor.remote_impls): the
    #: engine asks it for outputs, timing and memory instead of calling `run`
    remote: RemoteFn | None = None


_REGISTRY: dict[tuple[str, str], Impl] = {}
_HIDDEN_KINDS: frozenset[str] = frozenset({"mutant", "alternative", "testing"})
_loaded: set[str] = set()


def register(impl: Impl, *, replace: bool = False) -> Impl:
    key = (impl.op, impl.name)
    if key in _REGISTRY and not replace and _REGISTRY[key] is not impl:
        raise ValueError(f"impl {impl.name!r} is already registered for op {impl.op!r}")
    _REGISTRY[key] = impl
    return impl


@contextlib.contextmanager
def scoped(impls: Iterable[Impl]) -> Iterator[dict[tuple[str, str], str]]:
    """Register `impls` for the length of the block and remove them after (a run's artifact
    proxies: two jobs' artifacts may use the same names). An impl whose (op, name) is already
    taken (a built-in, a plugin, a corpus impl) is left out; the block gets {(op, name):
    why} for those."""
    refused: dict[tuple[str, str], str] = {}
    added: list[tuple[str, str]] = []
    for impl in impls:
        key = (impl.op, impl.name)
        if key in _REGISTRY:
            refused[key] = (
                f"impl {impl.name!r} of op {impl.op!r} is already taken (a built-in or plugin "
                "of this worker); rename it"
            )
            continue
        _REGISTRY[key] = impl
        added.append(key)
    try:
        yield refused
    finally:
        for key in added:
            _REGISTRY.pop(key, None)


def _visible(impl: Impl, include_mutants: bool, include_testing: bool) -> bool:
    if impl.kind in ("mutant", "alternative"):  # the self-test's two corpora
        return include_mutants
    if impl.kind == "testing":
        return include_testing
    return True


def load(*, mutants: bool = False, testing: bool = False, plugins: bool = True) -> None:
    """Import every op's impl modules (idempotent; kassay.ops: built-in and plugin ops), and
    optionally the self-test's corpora (mutants, alternatives), the test-only impls and the
    `kassay.impls` entry-point plugins."""
    from kassay.ops import all_ops

    modules: list[str] = []
    for op in all_ops():
        modules += op.impl_modules
        if mutants:
            modules += op.corpus_modules
    if testing:
        modules.append("kassay.impls.testing")
    for mod in modules:
        if mod not in _loaded:
            try:
                importlib.import_module(mod)
            except ImportError as exc:  # Triton or a peer's package missing, say
                if (exc.name or "").startswith("kassay"):
                    # a module or name of ours missing ("cannot import name" included): a bug,
                    # not an optional dependency; left unmarked, the next load() raises again
                    raise
                log.info("impl module %s not available: %s", mod, exc)
            _loaded.add(mod)
    if plugins and "plugins" not in _loaded:
        _loaded.add("plugins")
        for ep in entry_points(group="kassay.impls"):
            try:
                obj = ep.load()
                made = obj() if callable(obj) and not isinstance(obj, Impl) else obj
                items: Iterable[Impl] = [made] if isinstance(made, Impl) else (made or [])
                for impl in items:
                    register(impl if impl.kind != "builtin" else _as_plugin(impl), replace=True)
            except Exception as exc:  # a broken plugin must not take the service down
                log.warning("impl plugin %s failed to load: %s", ep.name, exc)


def load_with_corpora(*, testing: bool = False) -> None:
    """load() with the self-test's corpora registered (still hidden from callers that do not
    ask for them): a worker runs the self-test's probes and a convergence suite's control arm
    (a correct alternative) whatever KASSAY_ENABLE_MUTANTS says. A build shipped without the
    corpora loads the rest."""
    try:
        load(mutants=True, testing=testing)
    except ModuleNotFoundError:  # a build without the mutant corpus
        load(testing=testing)


def _as_plugin(impl: Impl) -> Impl:
    return Impl(
        impl.op,
        impl.name,
        impl.run,
        impl.description,
        impl.supports,
        "plugin",
        impl.bug,
        impl.exposes,
        impl.nondeterministic,
    )


def get_impl(
    op: str, name: str, *, include_mutants: bool = False, include_testing: bool = False
) -> Impl:
    impl = _REGISTRY.get((op, name))
    if impl is None or not _visible(impl, include_mutants, include_testing):
        known = [
            i.name
            for i in list_impls(
                op, include_mutants=include_mutants, include_testing=include_testing
            )
        ]
        raise UnknownImplError(
            f"unknown impl {name!r} for op {op!r}{did_you_mean(name, known)}; known impls: "
            f"{', '.join(known) or '(none)'}",
            details={"field": "impls", "op": op, "allowed": known},
        )
    return impl


def list_impls(
    op: str | None = None, *, include_mutants: bool = False, include_testing: bool = False
) -> list[Impl]:
    return sorted(
        (
            i
            for i in _REGISTRY.values()
            if (op is None or i.op == op) and _visible(i, include_mutants, include_testing)
        ),
        key=lambda i: (i.op, i.name),
    )
