"""Short case names (#32): the params that vary within a suite, the regime and seed where they
vary, why coverage added a point; unique within the report; used by every format."""

from __future__ import annotations

from kassay.contract.names import short_names
from kassay.contract.results import CaseResult, Report, Summary, named
from kassay.reports.junit import to_junit
from kassay.reports.markdown import to_markdown


def _case(
    impl: str,
    params: dict,
    regime: str = "normal",
    seed: int = 0,
    coverage: str = "",
    status: str = "passed",
    suite: int = 0,
) -> CaseResult:
    cid = f"g{suite}-{regime}-{seed}-{coverage}-{sorted(params.items())}:{impl}"
    return CaseResult(
        case_id=cid,
        group_id=cid.split(":")[0],
        suite_index=suite,
        op="lse_merge",
        impl=impl,
        params=params,
        regime=regime,
        seed=seed,
        dtype="float32",
        status=status,
        coverage=coverage,
    )  # type: ignore[arg-type]


FULL = {
    "T": 16,
    "Hh": 2,
    "D": 32,
    "K": 2,
    "dtype": "float32",
    "lse_layout": "hT",
    "mode": "merge",
    "accumulate": "float32",
}


def test_names_keep_what_varies_and_stay_unique() -> None:
    cases = [
        _case("torch", {**FULL, "K": 2}),
        _case("torch", {**FULL, "K": 3}),
        _case("torch", {**FULL, "K": 3}, regime="huge"),
        _case("torch", {**FULL, "T": 37, "K": 3}, coverage="ragged sizes"),
        _case("torch", {**FULL, "T": 8, "Hh": 8, "D": 8}, coverage="dims coincide"),
        _case("torch", {**FULL, "T": 9, "Hh": 8, "D": 8}, coverage="dims coincide"),  # a clash
    ]
    names = short_names(cases)
    got = [names[c.case_id] for c in cases]
    assert got[:4] == [
        "lse_merge.torch K=2 [normal]",
        "lse_merge.torch K=3 [normal]",
        "lse_merge.torch K=3 [huge]",
        "lse_merge.torch K=3 [normal] +ragged sizes",
    ]
    assert len(set(got)) == len(got)  # the clash got the params that tell it apart
    assert "T=8" in got[4] and "T=9" in got[5]
    assert max(len(n) for n in got) < 70  # the full label ran to 100+ characters


def test_every_format_names_cases_by_their_short_name() -> None:
    cases = named(
        [
            _case("torch", {**FULL, "K": 2}),
            _case("broken", {**FULL, "K": 2}, status="failed"),
            _case("broken", {**FULL, "K": 3}, status="failed"),
        ]
    )
    rep = Report(name="r", summary=Summary.of(cases), cases=cases)
    junit = to_junit(rep)
    assert 'name="K=2"' in junit and 'name="K=3"' in junit and "accumulate" not in junit
    md = to_markdown(rep)
    head, rest = md.split("\n", 1)
    assert head.startswith("## ❌ kassay: r — 2 failed of 3")
    assert rest.index("### Not passing") < rest.index("<details>")
    assert (
        "| lse_merge.broken K=3 | failed |" in md and "accumulate" not in md.split("<details>")[0]
    )
