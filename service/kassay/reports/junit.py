"""JUnit XML: one testsuite per op, a testcase per case (classname op.impl, name its short
name), failures with their limits, regressions of the comparison as failures of type
`regression`, a cancelled job as an error."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import defaultdict

from kassay.contract.results import NOT_JUDGED, CaseResult, Report
from kassay.reports.cases import worst_output_lines
from kassay.reports.comparison_markdown import junit_message, regressions_by_case


def to_junit(report: Report) -> str:
    # With a comparison, a passing case that regressed fails with type "regression".
    passed = {c.case_id for c in report.cases if c.status == "passed"}
    regressed = {
        cid: e for cid, e in regressions_by_case(report.comparison).items() if cid in passed
    }
    cancelled = report.summary.cancelled
    suites = ET.Element(
        "testsuites",
        name=report.name,
        tests=str(report.summary.total + cancelled),
        failures=str(report.summary.failed + len(regressed)),
        errors=str(
            report.summary.error + report.summary.crashed + report.summary.timeout + cancelled
        ),
    )
    if cancelled:  # a CI step reading the JUnit must not pass a run that stopped short
        ts = ET.SubElement(suites, "testsuite", name="kassay", tests="1", failures="0", errors="1")
        tc = ET.SubElement(ts, "testcase", classname="kassay.job", name="job", time="0")
        left = report.summary.skipped
        ET.SubElement(
            tc, "error", message=f"job cancelled: {left} case(s) skipped", type="cancelled"
        )
    by_op: dict[str, list[CaseResult]] = defaultdict(list)
    for c in report.cases:
        by_op[c.op].append(c)
    for op, cases in by_op.items():
        ts = ET.SubElement(
            suites,
            "testsuite",
            name=op,
            tests=str(len(cases)),
            failures=str(sum(c.status == "failed" or c.case_id in regressed for c in cases)),
            errors=str(sum(c.status in ("error", "crashed", "timeout") for c in cases)),
            skipped=str(sum(c.status in NOT_JUDGED for c in cases)),
        )
        for c in cases:
            t = c.timing.median_ms / 1e3 if c.timing else c.duration_s
            tc = ET.SubElement(
                ts,
                "testcase",
                classname=f"{c.op}.{c.impl}",
                # the short name without op.impl (the classname has them)
                name=c.name.removeprefix(f"{c.op}.{c.impl}").strip() or c.label(),
                time=f"{t:.6f}",
            )
            if c.flags or c.coverage or c.ran_in != "trusted" or c.convergence is not None:
                props = ET.SubElement(tc, "properties")
                for flag in c.flags:
                    ET.SubElement(props, "property", name=flag, value="true")
                if c.coverage:
                    ET.SubElement(props, "property", name="added_by_coverage", value=c.coverage)
                if c.ran_in != "trusted":  # the job's own code: timing measured in its sandbox
                    ET.SubElement(props, "property", name="ran_in", value=c.ran_in)
                v = c.convergence
                if v is not None:  # the convergence verdict and its numbers
                    for key, val in (
                        ("convergence", v.verdict),
                        ("mean_diff", v.mean_diff),
                        ("ci_low", v.ci_low),
                        ("ci_high", v.ci_high),
                        ("margin", v.margin),
                        ("detectable", v.detectable),
                    ):
                        ET.SubElement(props, "property", name=key, value=str(val))
            if c.status == "failed":
                kind = c.flags[0] if c.flags else "tolerance"
                if c.convergence is not None:
                    kind = f"convergence-{c.convergence.verdict}"
                f = ET.SubElement(tc, "failure", message=c.message[:500], type=kind)
                f.text = "\n".join(worst_output_lines(c))
            elif c.status in ("error", "crashed", "timeout"):
                e = ET.SubElement(tc, "error", message=c.message[:500], type=c.status)
                e.text = c.message
            elif c.status in NOT_JUDGED:
                ET.SubElement(tc, "skipped", message=f"{c.status}: {c.message}"[:500])
            elif c.case_id in regressed:
                msg = junit_message(regressed[c.case_id])
                f = ET.SubElement(tc, "failure", message=msg[:500], type="regression")
                f.text = "\n".join(regressed[c.case_id].reasons)
            if c.status == "passed" and c.message:  # a note (e.g. a baseline explained)
                ET.SubElement(tc, "system-out").text = c.message
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, encoding="unicode")
