"""Job spec validation and grid expansion."""

import pytest

from kassay.errors import CaseLimitError, InvalidSpecError, UnknownImplError, UnknownOpError
from kassay.validate.spec import count_cases, expand, local_impl_check, parse_spec

SPEC = """
name: t
labels: {repo: kassay}
suites:
  - op: lse_merge
    impls: [torch, te_style]
    params: {T: 16, Hh: 2, D: 8, K: [2, 3], dtype: [float32, float16]}
    regimes: [normal, huge]
    seeds: [0, 1]
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
    assert "suites.0.params.K" in ei.value.message and "'K': 1" in ei.value.message
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
