"""Engine commands: `kassay run SPEC` (in-process, no servers) and `kassay selftest`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

# the report formats' names: the SDK's tested mirror of kassay.reports.FORMATS, already loaded
# by the client commands (the registry itself would add its renderers to every start-up)
from kassay_client._base import REPORT_MEDIA
from kassay_client.summary import EXIT_ERROR as EXIT_ERRORS
from kassay_client.summary import EXIT_FAILED, exit_code_of

if TYPE_CHECKING:
    from kassay.validate.selftest import SelftestResult


def register(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a job spec in-process and print the results",
        description="Run a job spec in-process (no servers). The self-test's mutants and correct "
        "alternatives are offered with KASSAY_ENABLE_MUTANTS=true, the test impls (crash, hang, "
        "raise, slowable) with KASSAY_ENABLE_TEST_IMPLS=true.",
    )
    p.add_argument("spec", help="job spec (YAML or JSON)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    for fmt in REPORT_MEDIA:  # --json, --junit, --markdown, --html: a file per format
        p.add_argument(f"--{fmt}", metavar="FILE", help=f"write the {fmt} report here")
    p.add_argument("--max-cases", type=int, default=None)
    p.add_argument("--quiet", action="store_true", help="no per-case lines")
    p.set_defaults(func=_cmd_run)

    s = sub.add_parser(
        "selftest",
        help="run the two corpora: every known bug (mutant) must be caught, no correct impl "
        "(torch, kassay, the correct alternatives) may fail",
    )
    s.add_argument("--device", default="auto")
    s.add_argument(
        "--only",
        nargs="*",
        help="run only these mutants (by name); add `fairness` to run the fairness corpus too",
    )
    s.set_defaults(func=_cmd_selftest)


def exit_code(summary: Any) -> int:
    """The exit code of a report's counts: the one table `kassay submit --wait` uses too
    (kassay_client.summary)."""
    return exit_code_of(summary, cancelled=bool(getattr(summary, "cancelled", False)))


def _cmd_run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.markup import escape

    from kassay import reports
    from kassay.contract.results import CaseResult
    from kassay.contract.spec import load_spec
    from kassay.errors import KassayError
    from kassay.reports.convergence import is_convergence
    from kassay.reports.convergence import label as convergence_label
    from kassay.settings import get_settings
    from kassay.validate.local import run_job
    from kassay_client.models import Report as ReportView
    from kassay_client.summary import print_summary

    console = Console(stderr=True)
    try:
        spec = load_spec(args.spec)
    except KassayError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        return EXIT_ERRORS

    def show(c: CaseResult) -> None:
        if not args.quiet:
            color = {"passed": "green", "failed": "red"}.get(c.status, "yellow")
            t = f" {c.timing.median_ms:.3f} ms" if c.timing else ""
            flags = f" [{', '.join(c.flags)}]" if c.flags else ""
            what = c.label()
            if is_convergence(c):  # the verdict's numbers, not the model's shape
                what = convergence_label(c) + (f" {c.message}" if c.message else "")
            # escaped: a label's "[normal seed=0]" is text, not rich markup (it vanished)
            text = escape(f"{flags} {c.op}.{c.impl} {what}{t}")
            console.print(f"[{color}]{c.status:>11}[/{color}]{text}")

    settings = get_settings()
    try:
        report = run_job(
            spec,
            device=args.device,
            max_cases=args.max_cases or settings.max_cases,
            include_mutants=settings.enable_mutants,
            include_testing=settings.enable_test_impls,
            on_result=show,
        )
    except KassayError as exc:
        console.print(f"[red]error:[/red] {exc.message}")
        return EXIT_ERRORS
    written = []
    for fmt in REPORT_MEDIA:
        path = getattr(args, fmt)
        if path:
            Path(path).write_text(reports.render(report, fmt))
            written.append(path)
    code = exit_code(report.summary)
    # the summary `kassay submit --wait` prints for the same report: the SDK's view of it,
    # read from the report's JSON as a server's client reads it
    view = ReportView.model_validate_json(reports.render(report, "json"))
    print_summary(view, code=code, where=written[0] if written else "kassay run " + args.spec)
    return code


def _cmd_selftest(args: argparse.Namespace) -> int:
    from kassay.errors import KassayError
    from kassay.validate.selftest import run_selftest

    try:
        result = run_selftest(device=args.device, only=args.only)
    except KassayError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return EXIT_ERRORS
    print_selftest(result)
    return 0 if result.ok else EXIT_FAILED


def print_selftest(result: SelftestResult) -> None:
    """The self-test's table and its one-line verdict, on the terminal (the engine computes the
    result, kassay.validate.selftest; the command renders it)."""
    from rich.console import Console
    from rich.table import Table

    from kassay.impls import get_impl

    t = Table(title="kassay selftest: known bugs against the default policies")
    for col in ("op", "mutant", "bug", "regimes", "mutant status", "caught", "correct impls"):
        t.add_column(col, overflow="fold")
    for pr in result.probes:
        impl = get_impl(pr.probe.op, pr.probe.mutant, include_mutants=True)
        statuses = ", ".join(sorted({c.status for c in pr.mutant_cases}))
        why = next((c.message for c in pr.mutant_cases if c.status != "passed"), "")
        corr = ", ".join(f"{c.impl}:{c.status}" for c in pr.correct_cases) or "(none)"
        t.add_row(
            pr.probe.op,
            pr.probe.mutant,
            impl.bug or "",
            "plain spec" if pr.probe.plain else ",".join(pr.probe.regimes),
            f"{statuses}\n{why[:160]}",
            "[green]yes[/green]" if pr.detected else "[red]NO[/red]",
            corr,
        )
    console = Console()
    console.print(t)
    false = [c for pr in result.probes for c in pr.false_failures] + result.fairness_false
    for c in false:
        console.print(f"[red]false failure[/red] {c.op}.{c.impl} {c.label()}: {c.message}")
    print(result.line())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(1)
