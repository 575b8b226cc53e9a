"""Job spec validation and grid expansion."""

import pytest

from kassay.contract.spec import parse_spec
from kassay.errors import CaseLimitError, InvalidSpecError, UnknownImplError, UnknownOpError
from kassay.ops.expand import count_cases, expand, expand_parsed
from kassay.validate.local import local_impl_check

SPEC = """
name: t
labels: {repo: kassay}
suites:
  - op: lse_merge
    impls: [torch, te_style]
    params: {T: 16, Hh: 2, D: 8, K: [2, 3], dtype: [float32, float16]}
    regimes: [normal, huge]
    seeds: [0, 1]
    coverage: none
"""


def test_grid_expands_cartesian_product() -> None:
    spec = parse_spec(SPEC)
    groups = expand(spec)
    assert count_cases(spec) == 2 * 2 * 2 * 2 * 2
    assert len(groups) == 16
    assert {(g.params["K"], g.params["dtype"]) for g in groups} == {
        (2, "float32"),
        (3, "float32"),
        (2, "float16"),
        (3, "float16"),
    }
    assert len({g.group_id for g in groups}) == 16
    assert groups[0].case_ids()[0].endswith(":torch")
    # defaults of the op are filled in
    assert groups[0].params["mode"] == "merge" and groups[0].params["lse_layout"] == "hT"


def test_expansion_keeps_each_run_groups_parsed_params() -> None:
    """Admission prices groups with the params expansion parsed (no second parse): every run
    group has them, grid, coverage and convergence alike, and they are what the group carries."""
    text = SPEC.replace("coverage: none", "coverage: standard")
    text += """  - op: flce
    impls: [torch]
    params: {N: 16, H: 8, V: 32, dtype: [float32, bfloat16], autocast: float16}
  - op: lse_merge
    impls: [torch]
    params: {}
    convergence: {steps: 4, seeds: 2}
"""
    spec = parse_spec(text)
    got = expand_parsed(spec)
    assert got.groups == expand(spec)
    run = [g for g in got.groups if not g.skip]
    assert any(g.coverage for g in run) and any(g.convergence for g in run)
    assert any(g.skip for g in got.groups)  # autocast float16 of bfloat16: refused, skipped
    assert set(got.params) == {g.group_id for g in run}
    for g in run:
        assert got.params[g.group_id].model_dump() == g.params


def test_group_ids_are_stable() -> None:
    assert [g.group_id for g in expand(parse_spec(SPEC))] == [
        g.group_id for g in expand(parse_spec(SPEC))
    ]


def test_case_cap() -> None:
    with pytest.raises(CaseLimitError, match="32 cases, over the cap of 10"):
        expand(parse_spec(SPEC), max_cases=10)
    spec = parse_spec(SPEC.replace("name: t", "name: t\nmax_cases: 5"))
    with pytest.raises(CaseLimitError):
        expand(spec)


def test_bad_params_name_the_field_and_grid_point() -> None:
    bad = SPEC.replace("K: [2, 3]", "K: [2, 1]")
    with pytest.raises(InvalidSpecError) as ei:
        expand(parse_spec(bad))
    assert "suites.0.params.K" in ei.value.message and '"K": 1' in ei.value.message
    bad_dtype = SPEC.replace("float16]", "float8]")
    with pytest.raises(InvalidSpecError, match="dtype"):
        expand(parse_spec(bad_dtype))


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(UnknownOpError, match="known ops: flce, lse_merge"):
        expand(parse_spec(SPEC.replace("op: lse_merge", "op: softmax")))
    with pytest.raises(UnknownImplError, match=r"known impls:.*ring_style.*torch"):
        expand(parse_spec(SPEC.replace("te_style", "te_styel")), check_impl=local_impl_check())
    with pytest.raises(InvalidSpecError, match="known regimes: normal, huge"):
        expand(parse_spec(SPEC.replace("[normal, huge]", "[normal, enormous]")))


def test_mutants_are_hidden_unless_asked() -> None:
    spec = parse_spec(SPEC.replace("te_style", "m_copy_update"))
    with pytest.raises(UnknownImplError):
        expand(spec, check_impl=local_impl_check())
    assert expand(spec, check_impl=local_impl_check(include_mutants=True))


def test_expansion_without_an_impl_check_leaves_impl_names_to_the_workers() -> None:
    # The API expands with no local registry: unknown impl names pass here and are judged
    # against what the workers describe.
    groups = expand(parse_spec(SPEC.replace("te_style", "my_plugin_impl")))
    assert all("my_plugin_impl" in g.impls for g in groups)


def test_structural_errors() -> None:
    with pytest.raises(InvalidSpecError, match="suites"):
        parse_spec("name: x\n")
    with pytest.raises(InvalidSpecError, match="not valid YAML"):
        parse_spec("name: [unclosed")
    with pytest.raises(InvalidSpecError, match="mapping"):
        parse_spec("- a\n- b\n")
    with pytest.raises(InvalidSpecError, match="extra_field"):
        parse_spec(SPEC + "extra_field: 1\n")


def test_flce_param_rules() -> None:
    base = "name: f\nsuites:\n  - op: flce\n    impls: [torch]\n    params: {N: 4, H: 4, V: 8, "
    with pytest.raises(InvalidSpecError, match="autocast"):
        expand(parse_spec(base + "dtype: bfloat16, autocast: bfloat16}\n"))
    with pytest.raises(InvalidSpecError, match="ignore_index"):
        expand(parse_spec(base + "ignore_index: 3}\n"))
    with pytest.raises(InvalidSpecError, match="greater than 0"):
        expand(parse_spec(base.replace("N: 4", "N: 0") + "dtype: float32}\n"))


PLAIN = """
name: plain
suites:
  - op: flce
    impls: [torch]
    params: {N: 64, H: 128, V: 256, dtype: float32}
"""


def test_a_plain_suite_runs_every_regime_and_adds_marked_coverage_points() -> None:
    groups = expand(parse_spec(PLAIN))
    grid = [g for g in groups if not g.coverage]
    added = [g for g in groups if g.coverage]
    assert sorted(g.regime for g in grid) == ["all_ignored", "large_logits", "normal"]
    assert added and all(not g.timing.enabled for g in added)
    notes = " | ".join(g.coverage for g in added)
    for what in ("ragged sizes", "bias+softcap", "z-loss+label smoothing", "dims coincide",
                 "long reduction"):  # fmt: skip
        assert what in notes, notes
    ragged = next(g for g in added if g.coverage.startswith("ragged"))
    assert all(ragged.params[d] % 16 for d in ("N", "H", "V"))
    assert ragged.params["ignore_fraction"] > 0  # ignored targets, though the user had none
    keys = [(tuple(sorted(g.params.items())), g.regime) for g in groups]
    assert len(set(keys)) == len(keys)  # nothing run twice


def test_coverage_none_and_listed_regimes_keep_the_grid_alone() -> None:
    spec = parse_spec(PLAIN.replace("float32}", "float32}\n    coverage: none"))
    assert len(expand(spec)) == 3  # every regime, no added point
    spec = parse_spec(
        PLAIN.replace("float32}", "float32}\n    coverage: none\n    regimes: [normal]")
    )
    assert [g.regime for g in expand(spec)] == ["normal"]
    # listed regimes with coverage on: the other regimes come back as added points
    spec = parse_spec(PLAIN.replace("float32}", "float32}\n    regimes: [normal]"))
    added = {g.regime for g in expand(spec) if g.coverage.startswith("regime")}
    assert added == {"large_logits", "all_ignored"}


def test_lse_merge_coverage_reaches_coinciding_dims_and_many_states() -> None:
    spec = parse_spec(
        "name: l\nsuites:\n  - op: lse_merge\n    impls: [torch]\n"
        "    params: {T: 128, Hh: 4, D: 64, K: 2, dtype: float16}\n"
    )
    added = [g for g in expand(spec) if g.coverage]
    assert any(g.params["T"] == g.params["Hh"] for g in added)
    assert any(g.params["K"] == 64 for g in added)
    assert {g.regime for g in added} >= {"normal"}
    assert any(g.params["lse_layout"] == "Th" for g in added)


def test_artifacts_reach_every_group_the_added_coverage_points_included() -> None:
    digests = ["a" * 64, "0123456789abcdef" * 4]
    spec = parse_spec({**_plain_dict(), "artifacts": digests})
    groups = expand(spec)
    assert any(g.coverage for g in groups)
    # coverage groups run the suite's impls too, and those may come from the artifacts
    assert all(g.artifacts == digests for g in groups)
    assert all(not g.artifacts for g in expand(parse_spec(_plain_dict())))


@pytest.mark.parametrize(
    "artifacts",
    [
        ["A" * 64],  # upper-case hex
        ["a" * 63],
        ["g" * 64],
        [1],  # not coerced: the spec models are strict
        "a" * 64,  # one digest, not a list
        ["a" * 64, "a" * 64],
        [f"{i:064x}" for i in range(17)],  # over the cap
    ],
)
def test_artifacts_are_lowercase_sha256_digests_in_a_bounded_list(artifacts: object) -> None:
    with pytest.raises(InvalidSpecError, match="artifacts"):
        parse_spec({**_plain_dict(), "artifacts": artifacts})


def _plain_dict() -> dict[str, object]:
    return {
        "name": "p",
        "suites": [
            {"op": "flce", "impls": ["torch"], "params": {"N": 64, "H": 128, "V": 256}},
        ],
    }
