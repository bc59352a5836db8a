"""mhc_parity.harness.judging.policy and .bounds: file validation, rule precedence, each rule kind, NaN."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import textwrap

import ml_dtypes
import numpy as np
import pytest

from mhc_parity.harness.judging.bounds import KINDS, usage_of
from mhc_parity.harness.judging.confidence import Sensitivity, quantile
from mhc_parity.harness.judging.metrics import LeafMetrics, leaf_metrics
from mhc_parity.harness.judging.policy import (
    PARTITIONINGS,
    POLICY_COMPARISONS,
    POLICY_LEAF_KINDS,
    Judgement,
    PolicyError,
)
from mhc_parity.harness.judging.policy_file import DEFAULT_POLICY_PATH, load_policy, parse_policy
from mhc_parity.records import schema
from mhc_parity.records.text import format_number

F32_EPS = 2.0**-23
BF16_EPS = 2.0**-7
BELOW, ABOVE = 1 - 1e-9, 1 + 1e-9  # just inside / just outside a bound


def metrics(**overrides) -> LeafMetrics:
    """Clean metrics (everything zero/exact, cosine 1), then overrides."""
    base = {f.name: 0.0 for f in dataclasses.fields(LeafMetrics)}
    base.update({k: 0 for k in schema.INT_COLUMNS})
    base.update(cosine=1.0, oracle_ratio_max=1.0, oracle_ratio_rms=1.0)
    base.update(overrides)
    return LeafMetrics(**base)


def policy_text(*rules: str, header: str = "version = 2\n") -> str:
    return header + "".join("\n[[rule]]\n" + textwrap.dedent(r).strip() + "\n" for r in rules)


RATIO_RULE = """
    comparison = "vs_reference"
    dtype = "*"
    leaf_kind = "*"
    kind = "oracle_ratio"
    ratio = 2.0
    floor_ulps = 4
    direct_ulps = 2
    rationale = "test"
"""
EXACT_RULE = """
    comparison = "vs_unsharded"
    dtype = "*"
    leaf_kind = "*"
    kind = "exact"
    rationale = "test"
"""
ULPS_RULE = """
    comparison = "vs_unsharded"
    dtype = "*"
    leaf_kind = "weight_grad"
    kind = "ulps_of_max"
    max_rel_ulps = 64
    rationale = "test"
"""
SENSITIVITY_RULE = """
    comparison = "vs_oracle"
    dtype = "*"
    act_dtype = "bfloat16"
    leaf_kind = "*"
    kind = "ulps_plus_sensitivity"
    eps_dtype = "bfloat16"
    max_rel_ulps = 8
    ratio_sensitivity = 2
    rationale = "test"
"""


@pytest.fixture(scope="module")
def small():
    return parse_policy(policy_text(RATIO_RULE, EXACT_RULE, ULPS_RULE, SENSITIVITY_RULE))


def judge(policy, m, comparison, leaf_kind="output", dtype="float32", act_dtype=None, partitioning="manual"):
    return policy.judge(
        m,
        comparison=comparison,
        leaf_kind=leaf_kind,
        dtype=dtype,
        act_dtype=act_dtype or dtype,
        partitioning=partitioning,
    )


# ── the packaged file ────────────────────────────────────────────────────────────────


def test_packaged_policy_loads_and_covers_every_combination():
    policy = load_policy()
    assert policy.digest == hashlib.sha256(DEFAULT_POLICY_PATH.read_bytes()).hexdigest()
    assert policy.uncovered() == []
    for rule in policy.rules:
        assert len(rule.rationale) > 20, rule.label
        assert len(rule.rationale.splitlines()) <= 3, f"{rule.label}: a rationale of one to three lines"
    assert len(policy.systematic.rationale.splitlines()) <= 3
    for comparison in POLICY_COMPARISONS:
        for dtype in ("float32", "bfloat16"):
            for act in ("float32", "bfloat16"):
                for kind in POLICY_LEAF_KINDS:
                    for partitioning in PARTITIONINGS:
                        policy.rule_for(
                            comparison=comparison,
                            leaf_kind=kind,
                            dtype=dtype,
                            act_dtype=act,
                            partitioning=partitioning,
                        )


def test_packaged_policy_intent():
    policy = load_policy()
    for kind in ("output", "intermediate", "activation_grad"):
        rule = policy.rule_for(
            comparison="vs_unsharded", leaf_kind=kind, dtype="bfloat16", act_dtype="bfloat16", partitioning="manual"
        )
        assert rule.kind == "exact"
        # XLA-partitioned paths may re-block matmuls per shard: close, not bit-identical
        rule = policy.rule_for(
            comparison="vs_unsharded", leaf_kind=kind, dtype="bfloat16", act_dtype="bfloat16", partitioning="auto"
        )
        assert rule.kind == "ulps_of_max"
    rule = policy.rule_for(
        comparison="vs_unsharded", leaf_kind="weight_grad", dtype="float32", act_dtype="float32", partitioning="manual"
    )
    assert rule.kind == "ulps_of_max"
    with pytest.raises(PolicyError, match="partitioning=\\*"):
        policy.rule_for(comparison="vs_unsharded", leaf_kind="output", dtype="float32", act_dtype="float32")
    # vs_oracle rules scale with the oracle's sensitivity, which is measured in the
    # activation dtype's rounding: a float32 intermediate of a bfloat16 run and of a
    # float32 run fall under different rules
    in_bf16_run = policy.rule_for(
        comparison="vs_oracle", leaf_kind="intermediate", dtype="float32", act_dtype="bfloat16"
    )
    in_f32_run = policy.rule_for(comparison="vs_oracle", leaf_kind="intermediate", dtype="float32", act_dtype="float32")
    assert in_bf16_run.kind == in_f32_run.kind == "oracle_ratio"
    assert in_bf16_run.act_dtype == "bfloat16" and in_f32_run.act_dtype == "float32"


def test_packaged_policy_catches_a_bfloat16_cast_in_a_float32_run():
    """A gate computed through a bfloat16 cast (relative error ~2^-9) must fail vs_oracle
    and vs_reference in float32, while the float32 reference itself passes."""
    policy = load_policy()
    rng = np.random.default_rng(1)
    oracle = rng.uniform(0.1, 1.0, size=(4, 64))
    reference = oracle.astype(np.float32)
    cast = (oracle.astype(ml_dtypes.bfloat16)).astype(np.float32)
    ok = leaf_metrics(reference, oracle, oracle, dtype="float32")
    assert judge(policy, ok, "vs_oracle", "intermediate").verdict == "pass"
    bad = leaf_metrics(cast, oracle, oracle, dtype="float32")
    assert judge(policy, bad, "vs_oracle", "intermediate").verdict == "fail"
    bad_vs_ref = leaf_metrics(cast, reference, oracle, dtype="float32")
    assert judge(policy, bad_vs_ref, "vs_reference", "intermediate").verdict == "fail"


def test_packaged_policy_accepts_a_rounding_flip_in_bfloat16():
    policy = load_policy()
    rng = np.random.default_rng(2)
    oracle = rng.standard_normal(512)
    reference = oracle.astype(ml_dtypes.bfloat16)
    flipped = reference.copy()
    flipped[::7] = np.nextafter(reference[::7], np.where(reference[::7] > 0, 100, -100).astype(ml_dtypes.bfloat16))
    m = leaf_metrics(flipped, reference, oracle, dtype="bfloat16")
    assert m.max_ulp == 1.0
    j = judge(policy, m, "vs_reference", "output", "bfloat16")
    assert j.verdict == "pass", j


# ── validation ───────────────────────────────────────────────────────────────────────


def _replace(rule: str, old: str, new: str) -> str:
    assert old in rule
    return rule.replace(old, new)


MALFORMED = {
    "unknown key": (_replace(RATIO_RULE, 'kind = "oracle_ratio"', 'kind = "oracle_ratio"\nfudge = 3'), "fudge"),
    "unknown comparison": (_replace(RATIO_RULE, '"vs_reference"', '"vs_nothing"'), "comparison"),
    "lowering comparison": (_replace(RATIO_RULE, '"vs_reference"', '"lowering"'), "comparison"),
    "wildcard comparison": (_replace(RATIO_RULE, '"vs_reference"', '"*"'), "comparison"),
    "unknown leaf kind": (_replace(RATIO_RULE, 'leaf_kind = "*"', 'leaf_kind = "weights"'), "leaf_kind"),
    "program leaf kind": (_replace(RATIO_RULE, 'leaf_kind = "*"', 'leaf_kind = "program"'), "leaf_kind"),
    "unknown dtype": (_replace(RATIO_RULE, 'dtype = "*"', 'dtype = "float8"'), "dtype"),
    "unknown act_dtype": (_replace(RATIO_RULE, 'dtype = "*"', 'dtype = "*"\nact_dtype = "int8"'), "act_dtype"),
    "unknown kind": (_replace(RATIO_RULE, '"oracle_ratio"', '"closeish"'), "kind"),
    "missing kind": (_replace(RATIO_RULE, 'kind = "oracle_ratio"', ""), "kind"),
    "missing dtype": (_replace(RATIO_RULE, 'dtype = "*"', ""), "dtype"),
    "missing number": (_replace(RATIO_RULE, "floor_ulps = 4", ""), "floor_ulps"),
    "string number": (_replace(RATIO_RULE, "floor_ulps = 4", 'floor_ulps = "4"'), "floor_ulps"),
    "bool number": (_replace(RATIO_RULE, "floor_ulps = 4", "floor_ulps = true"), "floor_ulps"),
    "nan number": (_replace(RATIO_RULE, "floor_ulps = 4", "floor_ulps = nan"), "floor_ulps"),
    "negative floor": (_replace(RATIO_RULE, "floor_ulps = 4", "floor_ulps = -4"), "floor_ulps"),
    "sub-ulp floor": (_replace(RATIO_RULE, "floor_ulps = 4", "floor_ulps = 0.5"), "floor_ulps"),
    "zero floor": (_replace(RATIO_RULE, "floor_ulps = 4", "floor_ulps = 0"), "floor_ulps"),
    "ratio below one": (_replace(RATIO_RULE, "ratio = 2.0", "ratio = 0.9"), "ratio"),
    "version 1 ratio": (_replace(RATIO_RULE, "ratio = 2.0", "ratio_max = 2.0\nratio_rms = 2.0"), "ratio_max"),
    "removed kind": (_replace(ULPS_RULE, '"ulps_of_max"', '"rel_bound"'), "kind"),
    "sub-ulp direct": (_replace(RATIO_RULE, "direct_ulps = 2", "direct_ulps = 0.5"), "direct_ulps"),
    "sub-ulp bound": (_replace(ULPS_RULE, "max_rel_ulps = 64", "max_rel_ulps = 0.25"), "max_rel_ulps"),
    "foreign number": (_replace(EXACT_RULE, 'kind = "exact"', 'kind = "exact"\nmax_rel_ulps = 4'), "max_rel_ulps"),
    "missing rationale": (_replace(EXACT_RULE, 'rationale = "test"', ""), "rationale"),
    "empty rationale": (_replace(EXACT_RULE, 'rationale = "test"', 'rationale = "  "'), "rationale"),
    "unknown eps_dtype": (_replace(SENSITIVITY_RULE, 'eps_dtype = "bfloat16"', 'eps_dtype = "float128"'), "eps_dtype"),
    "sub-ulp eps_dtype": (_replace(SENSITIVITY_RULE, 'eps_dtype = "bfloat16"', 'eps_dtype = "float32"'), "eps_dtype"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_rule_is_rejected_naming_rule_and_field(name):
    bad_rule, field = MALFORMED[name]
    text = policy_text(EXACT_RULE if bad_rule is not EXACT_RULE else ULPS_RULE, bad_rule)
    with pytest.raises(PolicyError) as info:
        parse_policy(text)
    msg = str(info.value)
    assert "rule 1" in msg, msg
    assert repr(field) in msg, msg


def test_rule_message_shows_its_match_keys():
    with pytest.raises(PolicyError, match=r"rule 0 \(comparison=vs_reference, dtype=\*, leaf_kind=\*\).*'floor_ulps'"):
        parse_policy(policy_text(_replace(RATIO_RULE, "floor_ulps = 4", "floor_ulps = 0.5")))


def test_direct_ulps_zero_disables_the_direct_criterion():
    policy = parse_policy(policy_text(_replace(RATIO_RULE, "direct_ulps = 2", "direct_ulps = 0")))
    assert policy.rules[0].bound.direct_ulps == 0.0
    m = metrics(cand_oracle_max_err=1.0, partner_oracle_max_err=1e-9, max_rel_err=0.0)
    j = judge(policy, m, "vs_reference")
    assert j.verdict == "fail" and "direct" not in j.bound


def test_duplicate_rules_name_both():
    with pytest.raises(PolicyError, match=r"rule 2 .*duplicate of rule 0"):
        parse_policy(policy_text(EXACT_RULE, ULPS_RULE, _replace(EXACT_RULE, "exact", "exact")))
    # an explicit act_dtype = "*" is the same key as an omitted one
    with pytest.raises(PolicyError, match="duplicate"):
        parse_policy(policy_text(EXACT_RULE, _replace(EXACT_RULE, 'dtype = "*"', 'dtype = "*"\nact_dtype = "*"')))


@pytest.mark.parametrize(
    "text, field",
    [
        ("version = 2\n", "rule"),
        (policy_text(EXACT_RULE, header=""), "version"),
        (policy_text(EXACT_RULE, header="version = 3\n"), "version"),
        (policy_text(EXACT_RULE, header="version = 2\ndefaults = 3\n"), "defaults"),
        ("version = 2\nrule = 5\n", "rule"),
    ],
)
def test_malformed_file_level(text, field):
    with pytest.raises(PolicyError, match=repr(field)):
        parse_policy(text)


def test_invalid_toml_and_missing_file(tmp_path):
    with pytest.raises(PolicyError, match="not valid TOML"):
        parse_policy("version = \n")
    with pytest.raises(PolicyError, match="cannot read policy file"):
        load_policy(tmp_path / "nope.toml")


def test_load_policy_from_a_path_digests_its_bytes(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(policy_text(EXACT_RULE), encoding="utf-8")
    policy = load_policy(path)
    assert policy.digest == hashlib.sha256(path.read_bytes()).hexdigest()
    assert policy.source == str(path)
    path.write_text(policy_text(EXACT_RULE) + "# changed\n", encoding="utf-8")
    assert load_policy(path).digest != policy.digest


# ── precedence ───────────────────────────────────────────────────────────────────────


def _ulps_rule(dtype: str, leaf_kind: str, ulps: int, act_dtype: str | None = None) -> str:
    act = f'act_dtype = "{act_dtype}"\n' if act_dtype else ""
    return (
        f'comparison = "vs_unsharded"\ndtype = "{dtype}"\n{act}leaf_kind = "{leaf_kind}"\n'
        f'kind = "ulps_of_max"\nmax_rel_ulps = {ulps}\nrationale = "t"\n'
    )


def test_most_specific_rule_wins():
    policy = parse_policy(
        policy_text(
            _ulps_rule("*", "*", 100),
            _ulps_rule("bfloat16", "*", 50),
            _ulps_rule("*", "output", 20),
            _ulps_rule("bfloat16", "output", 10),
            _ulps_rule("bfloat16", "output", 5, act_dtype="float32"),
        )
    )

    def ulps(dtype, kind, act="bfloat16"):
        return policy.rule_for(comparison="vs_unsharded", leaf_kind=kind, dtype=dtype, act_dtype=act).bound.max_rel_ulps

    assert ulps("float32", "weight_grad") == 100
    assert ulps("bfloat16", "weight_grad") == 50
    assert ulps("float32", "output") == 20
    assert ulps("bfloat16", "output") == 10
    assert ulps("bfloat16", "output", act="float32") == 5
    # rule order in the file does not matter
    reversed_policy = parse_policy(
        policy_text(
            _ulps_rule("bfloat16", "output", 10),
            _ulps_rule("*", "output", 20),
            _ulps_rule("*", "*", 100),
            _ulps_rule("bfloat16", "*", 50),
        )
    )
    assert (
        reversed_policy.rule_for(
            comparison="vs_unsharded", leaf_kind="output", dtype="bfloat16", act_dtype="bfloat16"
        ).bound.max_rel_ulps
        == 10
    )


def test_incomparable_rules_are_rejected_at_load():
    with pytest.raises(PolicyError, match=r"ambiguous.*dtype=bfloat16.*leaf_kind=output.*rule 0.*rule 1"):
        parse_policy(policy_text(_ulps_rule("bfloat16", "*", 50), _ulps_rule("*", "output", 20)))


def test_unmatched_combination_names_it(small):
    with pytest.raises(
        PolicyError,
        match=r"comparison=vs_oracle, partitioning=manual, dtype=float32, act_dtype=float32, leaf_kind=output",
    ):
        judge(small, metrics(), "vs_oracle", "output", "float32", "float32")
    with pytest.raises(PolicyError, match="lowering"):
        judge(small, metrics(), "lowering", "output")
    with pytest.raises(PolicyError, match="program"):
        judge(small, metrics(), "vs_reference", "program")
    with pytest.raises(PolicyError, match="float64"):
        judge(small, metrics(), "vs_reference", "output", "float64")


def test_resolve_remembers_answers_never_errors(small):
    """Answers are kept per combination (dtype objects and names alike); an uncovered
    combination raises every time it is asked."""
    keys = dict(comparison="vs_oracle", leaf_kind="output", partitioning="manual")
    first = small.resolve(**keys, dtype="float32", act_dtype="bfloat16")
    assert small.resolve(**keys, dtype=np.float32, act_dtype=ml_dtypes.bfloat16) is first
    assert small.resolve(**keys, dtype="bfloat16", act_dtype="bfloat16") is not first
    for _ in range(2):
        with pytest.raises(PolicyError, match="no tolerance rule"):
            small.resolve(**keys, dtype="float32", act_dtype="float32")
    assert small == parse_policy(policy_text(RATIO_RULE, EXACT_RULE, ULPS_RULE, SENSITIVITY_RULE))


def test_judge_accepts_dtype_objects(small):
    j = small.judge(
        metrics(), comparison="vs_oracle", leaf_kind="output", dtype=np.float32, act_dtype=ml_dtypes.bfloat16
    )
    assert j.verdict == "pass" and "bfloat16 eps" in j.bound


# ── each rule kind across its bound ──────────────────────────────────────────────────


def test_exact(small):
    j = judge(small, metrics(), "vs_unsharded", "output")
    assert (j.verdict, j.bound_usage, j.reason) == ("pass", 0.0, "")
    assert j.bound.startswith("exact")
    j = judge(small, metrics(max_abs_err=1e-45, max_rel_err=1e-45), "vs_unsharded", "output")
    assert j.verdict == "fail" and j.bound_usage == math.inf
    assert "max_abs_err=1e-45" in j.reason


@pytest.mark.parametrize("dtype, unit", [("float32", F32_EPS), ("bfloat16", BF16_EPS)])
def test_ulps_of_max_across_its_bound(small, dtype, unit):
    limit = 64 * unit
    j = judge(small, metrics(max_rel_err=limit * BELOW), "vs_unsharded", "weight_grad", dtype)
    assert j.verdict == "pass" and j.bound_usage == pytest.approx(1.0) and j.bound_usage <= 1.0
    assert j.bound == f"max_rel<=64ulp [ulp={dtype} eps; rule 2]"
    j = judge(small, metrics(max_rel_err=limit * ABOVE), "vs_unsharded", "weight_grad", dtype)
    assert j.verdict == "fail" and j.bound_usage > 1.0
    assert "max_rel_err=" in j.reason and "64ulp" in j.reason


def test_ulps_of_max_end_to_end_on_bfloat16_arrays(small):
    p = np.array([1.0, -0.5], dtype=ml_dtypes.bfloat16)
    within = np.array([1.0 + 64 * BF16_EPS * 0.5, -0.5], dtype=ml_dtypes.bfloat16)
    m = leaf_metrics(within, p, dtype="bfloat16")
    assert judge(small, m, "vs_unsharded", "weight_grad", "bfloat16").verdict == "pass"
    beyond = np.array([1.0 + 66 * BF16_EPS, -0.5], dtype=ml_dtypes.bfloat16)
    m = leaf_metrics(beyond, p, dtype="bfloat16")
    assert judge(small, m, "vs_unsharded", "weight_grad", "bfloat16").verdict == "fail"


def test_ulps_plus_sensitivity_in_another_dtypes_ulps(small):
    limit = 8 * BF16_EPS + 2 * 1e-3
    ok = judge(
        small,
        metrics(max_rel_err=limit * BELOW, oracle_sensitivity_max=1e-3),
        "vs_oracle",
        dtype="float32",
        act_dtype="bfloat16",
    )
    assert ok.verdict == "pass" and ok.bound_usage == pytest.approx(BELOW)
    assert ok.bound == "max_rel<=8ulp+2*sensitivity [ulp=bfloat16 eps; rule 3]"
    bad = judge(
        small,
        metrics(max_rel_err=limit * ABOVE, oracle_sensitivity_max=1e-3),
        "vs_oracle",
        dtype="bfloat16",
        act_dtype="bfloat16",
    )
    assert bad.verdict == "fail" and bad.reason.startswith("max_rel_err=") and "sensitivity(0.001)" in bad.reason


def test_version_1_files_are_refused_saying_what_changed():
    with pytest.raises(PolicyError, match="ratio_max and ratio_rms .* one 'ratio'"):
        parse_policy(policy_text(EXACT_RULE, header="version = 1\n"))


def test_every_rule_kind_is_a_class_the_packaged_policy_uses():
    """No unused kinds: each kind of mhc_parity.harness.judging.bounds judges some rule of the packaged file."""
    used = {rule.kind for rule in load_policy().rules}
    assert used == set(KINDS)
    for kind in KINDS.values():
        assert callable(kind.judge) and callable(kind.describe) and kind.reads


def _ratio_metrics(cand_max, part_max, cand_rms, part_rms, direct):
    return metrics(
        cand_oracle_max_err=cand_max,
        partner_oracle_max_err=part_max,
        cand_oracle_rms_err=cand_rms,
        partner_oracle_rms_err=part_rms,
        max_rel_err=direct,
    )


def test_oracle_ratio_across_the_ratio_criterion(small):
    part = 1e-5
    lim_max = lim_rms = 2.0 * part + 4 * F32_EPS
    far = 1.0  # the direct criterion does not help
    j = judge(small, _ratio_metrics(lim_max * BELOW, part, lim_rms * BELOW, part, far), "vs_reference")
    assert j.verdict == "pass" and j.bound_usage == pytest.approx(1.0) and j.reason == ""
    assert j.bound == "ratio<=2 +4ulp | direct<=2ulp [ulp=float32 eps; rule 0]"
    j = judge(small, _ratio_metrics(lim_max * ABOVE, part, 0.0, part, far), "vs_reference")
    assert j.verdict == "fail" and j.reason.startswith("cand_oracle_max_err=")
    assert "partner_oracle_max_err" in j.reason and "not indistinguishable" in j.reason
    j = judge(small, _ratio_metrics(0.0, part, lim_rms * ABOVE, part, far), "vs_reference")
    assert j.verdict == "fail" and j.reason.startswith("cand_oracle_rms_err=")


def test_oracle_ratio_floor_covers_an_exact_partner(small):
    floor = 4 * F32_EPS
    j = judge(small, _ratio_metrics(floor * BELOW, 0.0, floor * BELOW, 0.0, 1.0), "vs_reference")
    assert j.verdict == "pass"
    j = judge(small, _ratio_metrics(floor * ABOVE, 0.0, 0.0, 0.0, 1.0), "vs_reference")
    assert j.verdict == "fail"
    # the floor is in ulps of the compared dtype
    j = judge(small, _ratio_metrics(4 * BF16_EPS * BELOW, 0.0, 0.0, 0.0, 1.0), "vs_reference", dtype="bfloat16")
    assert j.verdict == "pass"


def test_oracle_ratio_direct_criterion(small):
    direct = 2 * F32_EPS
    m = _ratio_metrics(1.0, 1e-9, 1.0, 1e-9, direct * BELOW)  # far apart from the oracle, yet indistinguishable
    j = judge(small, m, "vs_reference")
    assert j.verdict == "pass" and j.bound_usage == pytest.approx(BELOW)  # the direct criterion's usage
    j = judge(small, _ratio_metrics(1.0, 1e-9, 1.0, 1e-9, direct * ABOVE), "vs_reference")
    assert j.verdict == "fail" and j.bound_usage == pytest.approx(ABOVE)
    assert "max_rel_err=" in j.reason and "direct 2ulp" in j.reason


def test_oracle_ratio_without_oracle_is_a_harness_error(small):
    nan = float("nan")
    with pytest.raises(ValueError, match="without an oracle"):
        judge(small, _ratio_metrics(nan, nan, nan, nan, 0.0), "vs_reference")


# ── NaN and Inf never pass ───────────────────────────────────────────────────────────

ALL_KINDS = [
    ("vs_reference", "output", "float32", "float32"),  # oracle_ratio
    ("vs_unsharded", "output", "float32", "float32"),  # exact
    ("vs_unsharded", "weight_grad", "bfloat16", "bfloat16"),  # ulps_of_max
    ("vs_oracle", "output", "bfloat16", "bfloat16"),  # ulps_plus_sensitivity
]


@pytest.mark.parametrize("comparison, leaf_kind, dtype, act", ALL_KINDS)
def test_nan_in_candidate_always_fails(small, comparison, leaf_kind, dtype, act):
    # counts say NaN even though every error metric claims perfection: still a failure
    j = judge(small, metrics(nan_count=1), comparison, leaf_kind, dtype, act)
    assert j.verdict == "fail" and j.bound_usage == math.inf
    assert "1 NaN" in j.reason and "where the oracle and partner have none" in j.reason
    j = judge(small, metrics(inf_count=2, oracle_inf_count=2), comparison, leaf_kind, dtype, act)
    assert j.verdict == "fail" and "2 Inf" in j.reason and "oracle 0 NaN/2 Inf" in j.reason


@pytest.mark.parametrize("comparison, leaf_kind, dtype, act", ALL_KINDS)
def test_nan_metric_always_fails(small, comparison, leaf_kind, dtype, act):
    nan = float("nan")
    # NaN metrics with zero counts (cannot come from leaf_metrics, but a NaN is a NaN)
    m = metrics(max_abs_err=nan, max_rel_err=nan, rel_rms_err=nan, cand_oracle_max_err=nan, cand_oracle_rms_err=nan)
    j = judge(small, m, comparison, leaf_kind, dtype, act)
    assert j.verdict == "fail" and j.bound_usage == math.inf and "NaN" in j.reason


@pytest.mark.parametrize("comparison, leaf_kind, dtype, act", ALL_KINDS)
def test_nonfinite_partner_fails(small, comparison, leaf_kind, dtype, act):
    j = judge(small, metrics(partner_nan_count=3), comparison, leaf_kind, dtype, act)
    assert j.verdict == "fail" and "partner has 3 NaN" in j.reason


def test_nan_oracle_error_is_not_rescued_by_the_direct_criterion(small):
    m = _ratio_metrics(float("nan"), 1e-6, 0.0, 1e-6, 0.0)
    j = judge(small, m, "vs_reference")
    assert j.verdict == "fail" and j.reason == "cand_oracle_max_err is NaN"


def test_nonfinite_oracle_fails_a_ratio_rule(small):
    j = judge(small, metrics(oracle_nan_count=1), "vs_reference")
    assert j.verdict == "fail" and "oracle has 1 NaN" in j.reason


def test_nan_end_to_end_on_arrays():
    policy = load_policy()
    oracle = np.linspace(-1, 1, 64)
    partner = oracle.astype(np.float32)
    cand = partner.copy()
    cand[5] = np.nan
    for comparison in POLICY_COMPARISONS:
        expected = oracle if comparison == "vs_oracle" else partner
        m = leaf_metrics(cand, expected, oracle, dtype="float32")
        j = judge(policy, m, comparison, "output")
        assert j.verdict == "fail" and "1 NaN" in j.reason, (comparison, j)


# (comparison, leaf_kind, act_dtype, metrics, the binding metric, its limit) on `small`: each
# rule kind, and each criterion of the oracle ratio binding in turn.
BINDING = {
    "exact, identical": ("vs_unsharded", "output", "float32", metrics(), "max_abs_err", 0.0),
    "exact, differs": ("vs_unsharded", "output", "float32", metrics(max_abs_err=1e-7), "max_abs_err", 0.0),
    "ulps": ("vs_unsharded", "weight_grad", "float32", metrics(max_rel_err=80 * F32_EPS), "max_rel_err", 64 * F32_EPS),
    "ulps+sensitivity": (
        "vs_oracle",
        "output",
        "bfloat16",
        metrics(max_rel_err=0.01, oracle_sensitivity_max=0.003),
        "max_rel_err",
        8 * BF16_EPS + 2 * 0.003,
    ),
    "ratio, max": (
        "vs_reference",
        "output",
        "float32",
        metrics(cand_oracle_max_err=3e-6, partner_oracle_max_err=1e-6, max_rel_err=1.0),
        "cand_oracle_max_err",
        2 * 1e-6 + 4 * F32_EPS,
    ),
    "ratio, rms": (
        "vs_reference",
        "output",
        "float32",
        metrics(cand_oracle_rms_err=3e-6, partner_oracle_rms_err=1e-6, max_rel_err=1.0),
        "cand_oracle_rms_err",
        2 * 1e-6 + 4 * F32_EPS,
    ),
    "ratio, direct": (
        "vs_reference",
        "output",
        "float32",
        metrics(cand_oracle_max_err=1e-3, partner_oracle_max_err=1e-6, max_rel_err=3 * F32_EPS),
        "max_rel_err",
        2 * F32_EPS,
    ),
}


@pytest.mark.parametrize("name", list(BINDING))
def test_a_judgement_carries_the_limit_its_usage_divides(small, name):
    """allowed_error is the binding criterion's own limit, not one recomputed beside it: the
    usage is |measured| / allowed_error, and a failure's reason shows the same number."""
    comparison, kind, act_dtype, m, metric, allowed = BINDING[name]
    j = judge(small, m, comparison, kind, act_dtype=act_dtype)
    assert (j.bound_metric, j.allowed_error) == (metric, pytest.approx(allowed, rel=1e-12))
    assert j.bound_usage == usage_of(abs(getattr(m, metric)), j.allowed_error)
    if j.verdict == "fail":
        assert format_number(j.allowed_error, 4) in j.reason


def test_the_systematic_criterion_s_binding_limit_is_a_t_or_a_shift(with_systematic):
    t_binds = judge(with_systematic, _systematic_metrics(26.8, 1000 * F32_EPS), "vs_reference", "intermediate")
    assert (t_binds.bound_metric, t_binds.allowed_error, t_binds.verdict) == ("cand_systematic_t", 7.0, "fail")
    shift_binds = judge(with_systematic, _systematic_metrics(500, 2 * F32_EPS), "vs_reference", "intermediate")
    assert (shift_binds.bound_metric, shift_binds.allowed_error) == ("cand_systematic_shift", 4 * F32_EPS)
    assert shift_binds.bound_usage == pytest.approx(0.5)


def test_a_judgement_without_a_bound_applied_has_no_allowed_error(small):
    j = judge(small, metrics(nan_count=1), "vs_reference")
    assert j.verdict == "fail" and math.isinf(j.bound_usage)
    assert math.isnan(j.allowed_error) and j.bound_metric == ""


def test_judgement_row_fields():
    j = load_policy().judge(
        metrics(),
        comparison="vs_unsharded",
        leaf_kind="output",
        dtype="float32",
        act_dtype="float32",
        partitioning="manual",
    )
    fields = j.as_row_fields()
    assert set(fields) == {
        "verdict",
        "bound",
        "bound_usage",
        "allowed_error",
        "bound_metric",
        "reason",
        "oracle_quantile_max",
        "oracle_quantile_rms",
    }
    schema.empty_row(**fields)
    assert isinstance(j, Judgement) and j.verdict in schema.VERDICTS
    with pytest.raises(dataclasses.FrozenInstanceError):
        j.verdict = "fail"  # type: ignore[misc]


def test_unknown_partitioning_is_rejected_naming_the_field():
    text = DEFAULT_POLICY_PATH.read_text().replace('\npartitioning = "auto"', '\npartitioning = "xla"', 1)
    with pytest.raises(PolicyError, match=r"field 'partitioning': unknown partitioning 'xla'"):
        parse_policy(text)


def _sensitivity(size: float) -> Sensitivity:
    """A sensitivity of `size` (max, RMS and gain) over many degrees of freedom and draws."""
    return Sensitivity(max=size, rms=size, gain=size, dof_max=1e6, dof_rms=1e6, draws=10**6)


def test_oracle_ratio_scales_with_the_sensitivity_where_it_exceeds_the_partner():
    """An ill-conditioned leaf (large oracle sensitivity) gets the slack it explains,
    a well-conditioned one does not."""
    policy = load_policy()
    rng = np.random.default_rng(3)
    oracle = rng.uniform(0.5, 1.0, size=256)
    candidate = oracle * (1 + 1000 * F32_EPS)  # 1000 ulps off
    tight = leaf_metrics(candidate, oracle, oracle, dtype="float32", sensitivity=_sensitivity(F32_EPS))
    loose = leaf_metrics(candidate, oracle, oracle, dtype="float32", sensitivity=_sensitivity(500 * F32_EPS))
    failed = judge(policy, tight, "vs_oracle", "output")
    assert failed.verdict == "fail" and "sensitivity" in failed.reason
    assert judge(policy, loose, "vs_oracle", "output").verdict == "pass"
    assert loose.oracle_sensitivity_max == 500 * F32_EPS and math.isnan(
        leaf_metrics(candidate, oracle, oracle, dtype="float32").oracle_sensitivity_rms
    )


def test_ulps_plus_sensitivity_adds_the_conditioning_slack():
    policy = parse_policy(
        'version = 2\n[[rule]]\ncomparison = "vs_unsharded"\ndtype = "*"\nleaf_kind = "*"\n'
        'kind = "ulps_plus_sensitivity"\nmax_rel_ulps = 4\nratio_sensitivity = 16\nrationale = "test rule"\n'
    )
    limit = 4 * F32_EPS + 16 * 1e-5
    just_in = metrics(max_rel_err=limit * BELOW, oracle_sensitivity_max=1e-5)
    just_out = metrics(max_rel_err=limit * ABOVE, oracle_sensitivity_max=1e-5)
    assert judge(policy, just_in, "vs_unsharded").verdict == "pass"
    assert judge(policy, just_out, "vs_unsharded").verdict == "fail"
    # without a measured sensitivity only the ulps count
    assert judge(policy, metrics(max_rel_err=5 * F32_EPS), "vs_unsharded").verdict == "fail"
    with pytest.raises(PolicyError, match="ratio_sensitivity"):
        parse_policy(
            'version = 2\n[[rule]]\ncomparison = "vs_unsharded"\ndtype = "*"\nleaf_kind = "*"\n'
            'kind = "ulps_plus_sensitivity"\nmax_rel_ulps = 4\nratio_sensitivity = 0.5\nrationale = "test"\n'
        )


# ── the systematic-error criterion ───────────────────────────────────────────────────

SYSTEMATIC = """
[systematic]
leaf_kinds = ["intermediate"]
t_floor = 7
ratio = 3
rationale = "test"
"""


@pytest.fixture(scope="module")
def with_systematic():
    return parse_policy(policy_text(RATIO_RULE, header="version = 2\n" + SYSTEMATIC))


def _systematic_metrics(t, shift, partner_t=1.0, oracle_t=1.0):
    return metrics(
        cand_systematic_t=t,
        cand_systematic_shift=shift,
        partner_systematic_t=partner_t,
        oracle_systematic_t=oracle_t,
        max_rel_err=1.0,
    )


def test_systematic_criterion_fails_a_shift_shared_by_every_token(with_systematic):
    big_shift = 1000 * F32_EPS
    failed = judge(with_systematic, _systematic_metrics(26.8, big_shift), "vs_reference", "intermediate")
    assert failed.verdict == "fail" and "shared by every token" in failed.reason
    assert failed.bound_usage == pytest.approx(26.8 / 7)
    assert "; systematic t<=7 or 3x [" in failed.bound
    passed = judge(with_systematic, _systematic_metrics(7 * BELOW, big_shift), "vs_reference", "intermediate")
    assert passed.verdict == "pass" and passed.bound_usage == pytest.approx(BELOW)


def test_systematic_criterion_scales_with_the_models_own_t_and_ignores_tiny_shifts(with_systematic):
    big_shift = 1000 * F32_EPS
    # activations with a mean: the rounding model shifts every token too (t = 10), so 3x is allowed
    assert (
        judge(with_systematic, _systematic_metrics(29, big_shift, oracle_t=10), "vs_reference", "intermediate").verdict
        == "pass"
    )
    assert (
        judge(
            with_systematic,
            _systematic_metrics(29, big_shift, partner_t=10, oracle_t=float("nan")),
            "vs_reference",
            "intermediate",
        ).verdict
        == "pass"
    )
    assert (
        judge(with_systematic, _systematic_metrics(31, big_shift, oracle_t=10), "vs_reference", "intermediate").verdict
        == "fail"
    )
    # a shift within the rule's floor (4 ulps) passes whatever its t
    tiny = judge(with_systematic, _systematic_metrics(500, 4 * F32_EPS * BELOW), "vs_reference", "intermediate")
    assert tiny.verdict == "pass"


def test_systematic_criterion_allows_the_shift_the_backend_s_primitives_may_share(with_systematic):
    """The TPU v5e's sigmoid through softplus shifted h_post by 5.7e-5 on every token (t = 51):
    within its backend shift it passes, past it it fails; no backend term, no allowance."""
    shift, backend = 5.708e-5, 1.07e-4
    on_tpu = dataclasses.replace(_systematic_metrics(51.4, shift), oracle_backend_shift=backend)
    passed = judge(with_systematic, on_tpu, "vs_reference", "intermediate")
    assert passed.verdict == "pass"
    assert passed.bound_usage == pytest.approx(shift / (4 * F32_EPS + backend))
    pushed = dataclasses.replace(on_tpu, cand_systematic_shift=2 * (4 * F32_EPS + backend))
    failed = judge(with_systematic, pushed, "vs_reference", "intermediate")
    assert failed.verdict == "fail" and "4ulp+backend shift(" in failed.reason
    for none in (0.0, float("nan")):
        plain = dataclasses.replace(on_tpu, oracle_backend_shift=none)
        assert judge(with_systematic, plain, "vs_reference", "intermediate").verdict == "fail"


def test_systematic_criterion_applies_to_its_leaf_kinds_only(with_systematic):
    m = _systematic_metrics(500, 1.0)
    assert judge(with_systematic, m, "vs_reference", "output").verdict == "pass"
    unmeasured = _systematic_metrics(float("nan"), float("nan"))
    assert judge(with_systematic, unmeasured, "vs_reference", "intermediate").verdict == "pass"


@pytest.mark.parametrize(
    "table, field",
    [
        ('[systematic]\nleaf_kinds = ["intermediate"]\nt_floor = 0.5\nratio = 3\nrationale = "x"\n', "t_floor"),
        ('[systematic]\nleaf_kinds = ["no_such_kind"]\nt_floor = 7\nratio = 3\nrationale = "x"\n', "leaf_kinds"),
        ('[systematic]\nleaf_kinds = ["intermediate"]\nt_floor = 7\nratio = 3\n', "missing"),
        ('[systematic]\nleaf_kinds = ["intermediate"]\nt_floor = 7\nratio = 3\nrationale = " "\n', "rationale"),
    ],
)
def test_malformed_systematic_table_is_rejected(table, field):
    with pytest.raises(PolicyError, match=field):
        parse_policy(policy_text(RATIO_RULE, header="version = 2\n" + table))


def test_packaged_policy_catches_a_bfloat16_gate_bias_by_its_systematic_shift():
    """The upstream bug on ordinary weights: every token's h_pre moved the same way by a
    bias rounded to bfloat16, far less than its bfloat16-run noise in max and RMS."""
    policy = load_policy()
    rng = np.random.default_rng(5)
    oracle = 0.27 + 0.05 * rng.normal(size=(2, 256, 4))
    noise = 2e-4 * rng.normal(size=oracle.shape)
    clean = oracle + noise
    biased = clean + 1e-4  # a shared shift, half the per-token noise
    sensitivity = Sensitivity(
        max=1e-3, rms=5e-4, gain=5e-4 / math.sqrt(oracle.size), dof_max=50, dof_rms=2048, draws=16
    )
    kwargs = dict(dtype="float32", sensitivity=sensitivity, token_axes=2, oracle_systematic_t=1.0)
    good = leaf_metrics(clean, oracle, oracle, **kwargs)
    bad = leaf_metrics(biased, oracle, oracle, **kwargs)
    assert judge(policy, good, "vs_oracle", "intermediate", act_dtype="bfloat16").verdict == "pass"
    failed = judge(policy, bad, "vs_oracle", "intermediate", act_dtype="bfloat16")
    assert failed.verdict == "fail" and "shared by every token" in failed.reason
    assert bad.cand_oracle_rms_err < 2 * sensitivity.rms, "invisible to the RMS ratio alone"


def test_every_judged_row_records_the_quantile_its_sensitivity_is_scaled_by():
    """The gate's growth rule (mhc_parity.reports.gate.drift) reads q from the row: the bounds' own
    quantile of the policy's stated rate for the leaf's degrees of freedom and draws, whatever
    the rule, and on a row whose values no bound can judge; 1 under a policy stating no rate."""
    policy = load_policy()
    leaf = metrics(oracle_sensitivity_dof_max=1.0, oracle_sensitivity_dof_rms=64.0, oracle_draws=16.0)
    rate = policy.confidence.false_positive_rate
    expected = (quantile(rate, 1.0, 16), quantile(rate, 64.0, 16))
    assert expected[0] == pytest.approx(6.3, abs=0.1) and expected[1] == pytest.approx(1.4, abs=0.05)
    for comparison, partitioning, values in (
        ("vs_oracle", "*", leaf),
        ("vs_unsharded", "manual", leaf),
        ("vs_oracle", "*", dataclasses.replace(leaf, nan_count=1)),
    ):
        j = policy.judge(
            values,
            comparison=comparison,
            leaf_kind="weight_grad",
            dtype="float32",
            act_dtype="float32",
            partitioning=partitioning,
        )
        assert (j.quantile_max, j.quantile_rms) == expected, comparison
    without_rate = parse_policy(policy_text(RATIO_RULE, EXACT_RULE))
    j = judge(without_rate, leaf, "vs_reference")
    assert (j.quantile_max, j.quantile_rms) == (1.0, 1.0)


# ── the gain criterion (issue 66): a coherent scale at the mean's own noise ──────────────


def _scaled_leaf(kind: str, scale: float, *, dtype="bfloat16", peak=0.016, s_gain=9.4e-5) -> LeafMetrics:
    """A leaf scaled by `scale`, otherwise as correct bfloat16 code measures `out` (issue 66):
    within a bfloat16 ulp of the partner, gain partner 2.7e-5, S_gain 9.4e-5 over 16 draws."""
    gain = scale - 1.0
    return metrics(
        max_rel_err=abs(gain),
        cand_oracle_max_err=abs(gain),
        partner_oracle_max_err=0.02,
        cand_oracle_rms_err=abs(gain),
        partner_oracle_rms_err=0.01,
        oracle_sensitivity_max=0.02,
        oracle_sensitivity_rms=0.01,
        oracle_sensitivity_dof_max=50.0,
        oracle_sensitivity_dof_rms=2048.0,
        cand_oracle_gain=gain,
        partner_oracle_gain=2.7e-5,
        oracle_sensitivity_gain=s_gain,
        oracle_peak_to_l2=peak,
        oracle_draws=16.0,
    )


@pytest.mark.parametrize("kind", [k for k in POLICY_LEAF_KINDS if k != "*" and k != "program"])
@pytest.mark.parametrize("comparison", ["vs_oracle", "vs_reference"])
def test_a_coherent_bfloat16_scale_fails_on_every_leaf_kind_direct_or_not(kind, comparison):
    """Issue 66 item 1: a bfloat16 leaf 1% (and 0.3%) too large everywhere is inside 2 ulps of
    its partner, so `direct` would call it indistinguishable, and inside the old 2-ulp gain
    floor; its gain is ~100 spreads. It fails on every leaf kind, outputs and gradients."""
    policy = load_policy()
    for scale in (1.01, 1.003):
        j = judge(policy, _scaled_leaf(kind, scale), comparison, kind, dtype="bfloat16")
        assert j.verdict == "fail", (kind, comparison, scale, j)
        assert "coherent scale" in j.reason and "cand_oracle_gain" in j.reason
    assert judge(policy, _scaled_leaf(kind, 1.0), comparison, kind, dtype="bfloat16").verdict == "pass"


def test_the_gain_floor_is_the_element_floor_over_the_square_root_of_n_eff():
    """With no spread to speak of, the gain may reach floor_ulps ulps times max|o|/‖o‖₂ and no
    further; a one-element leaf (ratio 1) keeps the element floor."""
    policy = parse_policy(policy_text(RATIO_RULE, header="version = 2\n" + CONFIDENCE_ALL))
    for peak in (0.01, 1.0):
        floor = 4 * F32_EPS * peak
        for factor, verdict in ((BELOW, "pass"), (ABOVE, "fail")):
            leaf = metrics(cand_oracle_gain=-floor * factor, oracle_peak_to_l2=peak, max_rel_err=0.0, oracle_draws=16.0)
            assert judge(policy, leaf, "vs_reference", "weight_grad").verdict == verdict, (peak, factor)
    # a row with no recorded ratio gets no floor: stale input is judged more strictly
    leaf = metrics(cand_oracle_gain=1e-3 * F32_EPS, oracle_peak_to_l2=math.nan, oracle_draws=16.0)
    assert judge(policy, leaf, "vs_reference", "weight_grad").verdict == "fail"


CONFIDENCE_ALL = """
[confidence]
false_positive_rate = 1e-5
gain_leaf_kinds = ["output", "intermediate", "activation_grad", "weight_grad", "scale_grad", "branch_grad"]
rationale = "test"
"""


def test_the_packaged_policy_holds_the_gain_on_every_leaf_kind():
    """Outputs and gradients alike (issue 66): no oracle-ratio leaf kind goes without it."""
    kinds = set(load_policy().confidence.gain_leaf_kinds)
    assert kinds == {k for k in POLICY_LEAF_KINDS if k not in ("*", "program")}
