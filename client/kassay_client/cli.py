"""The client half of the `kassay` command: submit, wait, jobs, report, compare, cancel.

Exit codes: kassay_client.summary (the one table, shared with `kassay run`). --server and --token default to
$KASSAY_SERVER and $KASSAY_TOKEN.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kassay_client._base import REPORT_MEDIA

if TYPE_CHECKING:
    from kassay_client import Client, Job, Report

from kassay_client.summary import (  # noqa: F401 (EXIT_* and ci_log: this module's API)
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_PASSED,
    EXIT_REGRESSION,
    EXIT_UNREACHABLE,
    ci_log,
    exit_code_of,
    print_summary,
    summary_table,
)


def exit_code(job: Job) -> int:
    """0 all passed, 1 some failed, 2 errors/crashes/timeouts or a cancelled job
    (kassay_client.summary)."""
    return exit_code_of(job.progress, cancelled=job.state == "cancelled")


def register(sub: Any) -> None:
    p = sub.add_parser("submit", help="submit a job spec to a kassay server")
    _server_args(p)
    p.add_argument("spec", help="job spec file (YAML or JSON); - reads stdin")
    p.add_argument(
        "--label", action="append", default=[], metavar="K=V", help="add a label (repeat)"
    )
    p.add_argument(
        "--idempotency-key",
        default=None,
        help="resubmitting with the same key returns the same job",
    )
    p.add_argument(
        "--artifact",
        action="append",
        default=[],
        metavar="PATH",
        help="a wheel or .py module whose kassay.impls the job runs (uploaded first; repeat); "
        "needs a token with the code scope",
    )
    p.add_argument("--wait", action="store_true", help="wait for the job and report it")
    p.add_argument(
        "--compare-to",
        action="append",
        default=[],
        metavar="K=V|JOB_ID",
        help="compare the job, once over, with the latest finished job of the same name with "
        "these labels (repeat to AND; e.g. branch=main) on the same device kind, or with a job "
        "id; sets the spec's compare_to, so the reports include the comparison",
    )
    p.add_argument(
        "--regression-threshold",
        type=_fraction,
        default=None,
        metavar="PCT",
        help="slowdown (and memory growth) beyond which a significant change is a regression, "
        "for suites that set none: 3%% or 0.03 (default 3%%)",
    )
    _wait_args(p)
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("wait", help="wait for a job and report it")
    _server_args(p)
    p.add_argument("job_id")
    _wait_args(p)
    p.set_defaults(func=cmd_wait)

    p = sub.add_parser("compare", help="compare a job with an earlier one")
    _server_args(p)
    p.add_argument("job_id", help="the job to judge")
    p.add_argument(
        "to_job_id",
        nargs="?",
        help="the job to compare it with (else --to-labels, else its spec's compare_to)",
    )
    p.add_argument("--to-labels", action="append", default=[], metavar="K=V")
    p.add_argument("--threshold", type=_fraction, default=None, metavar="PCT")
    p.add_argument("--json", metavar="FILE", help="write the comparison as JSON here")
    p.add_argument("--markdown", metavar="FILE", help="write the comparison as Markdown here")
    p.add_argument("--fail-on-regression", action="store_true", help="exit 4 on a regression")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("jobs", help="list jobs on a kassay server")
    _server_args(p)
    p.add_argument("--state", choices=["queued", "running", "finished", "cancelled"])
    p.add_argument("--label", action="append", default=[], metavar="K=V")
    p.add_argument("--name")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_jobs)

    p = sub.add_parser(
        "impls",
        help="list the ops and impls the server's workers offer (mutants and correct "
        "alternatives only where the server runs with KASSAY_ENABLE_MUTANTS)",
    )
    _server_args(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of lines")
    p.set_defaults(func=cmd_impls)

    p = sub.add_parser("report", help="print or save a job's report")
    _server_args(p)
    p.add_argument("job_id")
    p.add_argument("--format", choices=list(REPORT_MEDIA), default="markdown")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("cancel", help="cancel a job")
    _server_args(p)
    p.add_argument("job_id")
    p.set_defaults(func=cmd_cancel)


def _server_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--server", default=os.environ.get("KASSAY_SERVER"), help="API URL (default $KASSAY_SERVER)"
    )
    p.add_argument(
        "--token", default=os.environ.get("KASSAY_TOKEN"), help="API token (default $KASSAY_TOKEN)"
    )


def _wait_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout", type=float, default=None, help="give up waiting after S s")
    for fmt in REPORT_MEDIA:  # --json, --junit, --markdown, --html: a file per format
        p.add_argument(f"--{fmt}", metavar="FILE", help=f"write the {fmt} report here")
    p.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    p.add_argument(
        "--cancel-on-timeout",
        action="store_true",
        help="cancel the job when --timeout ends the wait (else it keeps running)",
    )
    p.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit 4 when the job's comparison (compare_to) finds a regression",
    )


# ------------------------------------------------------------------------------- helpers


def _fraction(text: str) -> float:
    """ "3%" or "0.03" -> 0.03."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a percentage (3%) or a fraction"
        ) from None
    if not 0 < value <= 10:
        raise argparse.ArgumentTypeError(f"{text!r} must be above 0 and at most 1000%")
    return value


def _guarded(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from kassay_client.errors import (
            APIConnectionError,
            APIStatusError,
            KassayError,
            WaitTimeoutError,
        )

        if not args.server:
            print("kassay: no server: pass --server URL or set KASSAY_SERVER", file=sys.stderr)
            return EXIT_ERROR
        try:
            return fn(args)
        except APIConnectionError as exc:
            print(f"kassay: cannot reach {args.server}: {exc.message}", file=sys.stderr)
            return EXIT_UNREACHABLE
        except APIStatusError as exc:
            _print_api_error(exc)
            return EXIT_ERROR
        except WaitTimeoutError as exc:
            print(f"kassay: {exc.message} (timeout); it keeps running", file=sys.stderr)
            return EXIT_ERROR
        except KassayError as exc:
            print(f"kassay: {exc.message}", file=sys.stderr)
            return EXIT_ERROR

    run.__doc__ = fn.__doc__
    return run


def _print_api_error(exc: Any) -> None:
    print(f"kassay: the server refused: {exc.message}", file=sys.stderr)
    errors = exc.details.get("errors") if isinstance(exc.details, dict) else None
    for e in errors or []:
        loc = ".".join(str(p) for p in e.get("loc", []))
        print(f"  {loc}: {e.get('msg')}", file=sys.stderr)
    allowed = exc.details.get("allowed") if isinstance(exc.details, dict) else None
    if allowed:
        print(f"  known: {', '.join(map(str, allowed))}", file=sys.stderr)


def _client(args: argparse.Namespace) -> Client:
    from kassay_client import Client

    return Client(args.server, token=args.token)


def _labels(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise SystemExit(f"kassay: --label {item!r} must be KEY=VALUE")
        out[k] = v
    return out


#: seconds between two progress lines of a wait without a terminal (a CI log);
#: $KASSAY_PROGRESS_S sets it
PROGRESS_EVERY_S = 10.0


def follow(client: Client, job: Job, *, timeout: float | None = None, quiet: bool = False) -> Job:
    """Wait for a job: a rich progress bar on a terminal, else a progress line on stderr every
    PROGRESS_EVERY_S (done/total, failed so far), as a CI log wants."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from kassay_client.models import JobEvent

    if quiet:
        return client.jobs.wait(job.id, timeout=timeout)
    if not sys.stderr.isatty():
        return _follow_plain(client, job, timeout=timeout)
    console = Console(stderr=True)
    counts: dict[str, int] = {}
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task(
            job.name, total=job.progress.total, completed=job.progress.done, counts=""
        )

        def on_event(event: JobEvent) -> None:
            if event.result is not None:
                counts[event.result.status] = counts.get(event.result.status, 0) + 1
                bar.update(task, completed=sum(counts.values()), counts=_counts_text(counts))
            elif event.job is not None:
                p = event.job.progress
                snap = {
                    s: getattr(p, s)
                    for s in (
                        "passed",
                        "failed",
                        "error",
                        "crashed",
                        "timeout",
                        "unsupported",
                        "skipped",
                    )
                }
                bar.update(task, completed=p.done, counts=_counts_text(snap))

        return client.jobs.wait(job.id, timeout=timeout, on_event=on_event)


def _follow_plain(client: Client, job: Job, *, timeout: float | None) -> Job:
    import threading

    from kassay_client.models import JobEvent

    state = {"done": job.progress.done, "total": job.progress.total, "failed": 0, "errors": 0}
    t0 = time.monotonic()
    stop = threading.Event()

    def line() -> None:
        print(
            f"kassay: {state['done']}/{state['total']} cases done, {state['failed']} failed, "
            f"{state['errors']} error/crashed/timeout ({time.monotonic() - t0:.0f} s)",
            file=sys.stderr,
            flush=True,
        )

    every = float(os.environ.get("KASSAY_PROGRESS_S") or PROGRESS_EVERY_S)

    def tick() -> None:
        while not stop.wait(every):
            line()

    def on_event(event: JobEvent) -> None:
        if event.result is not None:
            state["done"] += 1
            state["failed"] += event.result.status == "failed"
            state["errors"] += event.result.status in ("error", "crashed", "timeout")
        elif event.job is not None:
            p = event.job.progress
            state.update(
                done=p.done, total=p.total, failed=p.failed, errors=p.error + p.crashed + p.timeout
            )

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        return client.jobs.wait(job.id, timeout=timeout, on_event=on_event)
    finally:
        stop.set()


def _counts_text(counts: dict[str, int]) -> str:
    colors = {
        "passed": "green",
        "failed": "red",
        "error": "magenta",
        "crashed": "magenta",
        "timeout": "magenta",
        "unsupported": "dim",
        "skipped": "dim",
    }
    return " ".join(f"[{colors.get(k, 'white')}]{k} {v}[/]" for k, v in counts.items() if v)


def write_reports(client: Client, job_id: str, paths: dict[str, str | None]) -> None:
    """Each report format named in `paths` (format -> file; None: not asked for) written there."""
    for fmt in REPORT_MEDIA:
        path = paths.get(fmt)
        if not path:
            continue
        r = client.request("GET", f"/v1/jobs/{job_id}/report", params={"format": fmt})
        Path(path).write_text(r.text)
        print(f"wrote {fmt} report to {path}", file=sys.stderr)


def _verdict(report: Report) -> str | None:
    """One line on the report's comparison; None when the job asked for none."""
    c = report.comparison
    if c is None:
        return None
    s = c.summary
    head = f"compared with {c.to_name} {c.to_job_id}"
    if not c.regression:
        return f"{head}: no regression ({s.compared} case keys in both)"
    lines = [f"{head}: {s.regressions} regression(s)"]
    for e in [e for e in c.cases if e.regression][:20]:
        lines.append(f"  {e.op}.{e.impl} {e.case_id or e.to_case_id}: {'; '.join(e.reasons)}")
    return "\n".join(lines)


def finish(client: Client, job: Job, args: argparse.Namespace) -> int:
    """Wait, print the summary table (and the comparison), write report files; the exit
    code."""

    from kassay_client.errors import WaitTimeoutError

    try:
        job = follow(client, job, timeout=args.timeout, quiet=args.quiet)
    except WaitTimeoutError:
        if getattr(args, "cancel_on_timeout", False):
            client.jobs.cancel(job.id)
            print(f"kassay: cancelled job {job.id} after {args.timeout:g} s", file=sys.stderr)
        raise
    report = client.jobs.report(job.id)
    code = exit_code(job)
    regressed = report.comparison is not None and report.comparison.regression
    if code == EXIT_PASSED and regressed and getattr(args, "fail_on_regression", False):
        code = EXIT_REGRESSION
    write_reports(client, job.id, {fmt: getattr(args, fmt, None) for fmt in REPORT_MEDIA})
    if report.comparison is None:
        _note_no_comparison(client, job.id)
    url = f"{client.base_url}/jobs/{job.id}"
    print_summary(report, code=code, where=url)
    if not sys.stdout.isatty():
        return code
    verdict = _verdict(report)
    if verdict is not None:
        print(verdict, file=sys.stderr)
    print(f"job {job.id} {job.state}: exit {code}  {url}", file=sys.stderr)
    return code


def _note_no_comparison(client: Client, job_id: str) -> None:
    """Say why a job whose spec asks for a comparison has none (e.g. no job on main yet)."""
    from kassay_client.errors import NotFoundError, UnprocessableEntityError

    try:
        client.jobs.compare(job_id)
    except NotFoundError as exc:
        print(f"kassay: no comparison: {exc.message}", file=sys.stderr)
    except UnprocessableEntityError:  # its spec asks for none
        pass


# ------------------------------------------------------------------------------ commands


@_guarded
def cmd_submit(args: argparse.Namespace) -> int:
    text = sys.stdin.read() if args.spec == "-" else None
    if text is None:
        try:
            text = Path(args.spec).read_text()
        except OSError as exc:
            print(f"kassay: cannot read {args.spec}: {exc.strerror}", file=sys.stderr)
            return EXIT_ERROR
    spec: str | dict[str, Any] = text
    if args.compare_to or args.regression_threshold is not None:
        spec = _with_compare_to(text, args.compare_to, args.regression_threshold)
    with _client(args) as client:
        digests = []
        for path in args.artifact:
            try:
                art = client.artifacts.upload(path)
            except OSError as exc:
                print(f"kassay: cannot read {path}: {exc.strerror}", file=sys.stderr)
                return EXIT_ERROR
            print(
                f"artifact {art.filename} sha256:{art.digest} ({art.size} bytes)", file=sys.stderr
            )
            digests.append(art.digest)
        job = client.jobs.create(
            spec,
            labels=_labels(args.label) or None,
            idempotency_key=args.idempotency_key,
            artifacts=digests or None,
        )
        print(
            f"job {job.id} {job.state}: {job.progress.total} cases  "
            f"{client.base_url}/jobs/{job.id}",
            file=sys.stderr,
        )
        if not (args.wait or any(getattr(args, fmt, None) for fmt in REPORT_MEDIA)):
            print(job.id)
            return EXIT_PASSED
        return finish(client, job, args)


def _with_compare_to(text: str, targets: list[str], threshold: float | None) -> dict[str, Any]:
    """The spec with compare_to set from --compare-to (K=V labels, or one job id) and
    --regression-threshold."""
    import yaml

    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise SystemExit("kassay: the job spec must be a mapping to add compare_to to it")
    compare_to = dict(data.get("compare_to") or {})
    ids = [t for t in targets if "=" not in t]
    if len(ids) > 1 or (ids and len(ids) != len(targets)):
        raise SystemExit("kassay: --compare-to takes one job id, or K=V labels")
    if ids:
        compare_to = {"job": ids[0], "threshold": compare_to.get("threshold")}
    elif targets:
        compare_to = {"labels": _labels(targets), "threshold": compare_to.get("threshold")}
    if threshold is not None:
        compare_to["threshold"] = threshold
    data["compare_to"] = {k: v for k, v in compare_to.items() if v is not None}
    return data


@_guarded
def cmd_compare(args: argparse.Namespace) -> int:
    with _client(args) as client:
        kw: dict[str, Any] = {
            "to": args.to_job_id,
            "to_labels": _labels(args.to_labels) or None,
            "threshold": args.threshold,
        }
        comparison = client.jobs.compare(args.job_id, **kw)
        markdown = client.jobs.compare(args.job_id, format="markdown", **kw)
    sys.stdout.write(markdown)
    if args.json:
        Path(args.json).write_text(comparison.model_dump_json(indent=2))
        print(f"wrote the comparison as JSON to {args.json}", file=sys.stderr)
    if args.markdown:
        Path(args.markdown).write_text(markdown)
        print(f"wrote the comparison as Markdown to {args.markdown}", file=sys.stderr)
    if comparison.regression and args.fail_on_regression:
        return EXIT_REGRESSION
    return EXIT_PASSED


@_guarded
def cmd_wait(args: argparse.Namespace) -> int:
    with _client(args) as client:
        return finish(client, client.jobs.get(args.job_id), args)


@_guarded
def cmd_jobs(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    with _client(args) as client:
        page = client.jobs.list(
            state=args.state, labels=_labels(args.label) or None, name=args.name, limit=args.limit
        )
    if args.json:
        print(json.dumps([j.model_dump(mode="json") for j in page.items], indent=2))
        return EXIT_PASSED
    table = Table()
    for col in (
        "id",
        "name",
        "state",
        "ok",
        "cases",
        "passed",
        "failed",
        "other",
        "created",
        "labels",
    ):
        table.add_column(col)
    for j in page.items:
        p = j.progress
        table.add_row(
            j.id,
            j.name,
            j.state,
            "" if j.ok is None else str(j.ok).lower(),
            f"{p.done}/{p.total}",
            str(p.passed),
            str(p.failed),
            str(p.error + p.crashed + p.timeout),
            j.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            ",".join(f"{k}={v}" for k, v in j.labels.items()),
        )
    Console().print(table)
    return EXIT_PASSED


@_guarded
def cmd_impls(args: argparse.Namespace) -> int:
    """The ops and impls the server's workers offer, with their kinds and which workers."""
    with _client(args) as client:
        workers = client.workers.list()
    offered: dict[tuple[str, str], tuple[str, list[str]]] = {}
    for w in workers:
        for op, names in w.ops.items():
            for name in names:
                kind = w.impl_kinds.get(op, {}).get(name, "")
                offered.setdefault((op, name), (kind, []))[1].append(w.address)
    if args.json:
        rows = [
            {"op": op, "impl": name, "kind": kind, "workers": ws}
            for (op, name), (kind, ws) in sorted(offered.items())
        ]
        print(json.dumps(rows, indent=2))
        return EXIT_PASSED
    if not offered:
        print("kassay: no worker has described itself yet", file=sys.stderr)
        return EXIT_ERROR
    for (op, name), (kind, ws) in sorted(offered.items()):
        where = "all workers" if len(ws) == len(workers) else ", ".join(ws)
        print(f"{op:10} {name:24} {kind:11} {where}")
    return EXIT_PASSED


@_guarded
def cmd_report(args: argparse.Namespace) -> int:
    with _client(args) as client:
        r = client.request("GET", f"/v1/jobs/{args.job_id}/report", params={"format": args.format})
    if args.output:
        Path(args.output).write_text(r.text)
        print(f"wrote {args.format} report to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(r.text if r.text.endswith("\n") else r.text + "\n")
    return EXIT_PASSED


@_guarded
def cmd_cancel(args: argparse.Namespace) -> int:
    with _client(args) as client:
        job = client.jobs.cancel(args.job_id)
    print(f"job {job.id} {job.state}: {job.progress.done}/{job.progress.total} cases done")
    return EXIT_PASSED


def submit_and_report(
    server: str,
    spec_path: str,
    *,
    token: str | None = None,
    print_markdown: bool = False,
    timeout: float | None = None,
) -> int:
    """Submit a spec file, follow it, print the summary table (and the Markdown report); the
    exit code. Used by `kassay demo`."""
    args = argparse.Namespace(
        server=server,
        token=token,
        timeout=timeout,
        **dict.fromkeys(REPORT_MEDIA),
        quiet=False,
    )

    @_guarded
    def run(args: argparse.Namespace) -> int:
        with _client(args) as client:
            job = client.jobs.create(Path(spec_path))
            print(f"job {job.id} submitted: {job.progress.total} cases", file=sys.stderr)
            code = finish(client, job, args)
            if print_markdown:
                print(client.jobs.report(job.id, format="markdown"))
            return code

    return run(args)
