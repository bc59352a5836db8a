"""mhc_parity.harness.faults.rounding_audit: every bfloat16 value of the reference path has a site in the
rounding model, and each site's share of a leaf's sensitivity."""

from __future__ import annotations

import contextlib
import io

import jax
import jax.numpy as jnp
import pytest

from mhc_parity.cases import registry
from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.harness.commands import faults as faults_cli
from mhc_parity.harness.faults import rounding_audit

MLP_CASE = "lite-n4-c128-b2s64-bf16-w32-mlp-mixed_signs"


@pytest.fixture(scope="module")
def mlp_case():
    case = registry.get(MLP_CASE)
    return case, make_fixture(case)


@pytest.fixture(scope="module")
def audit_run(tmp_path_factory):
    """One `mhc-parity faults --audit` run on the mlp mixed_signs case, each `CaseAudit` it made kept:
    the command's tables and `site_shares` (which `audit_case` calls on the case's own fixture) are
    checked on the same run, the costliest part of both (an oracle batch per rounding site)."""
    out, audits, printed = tmp_path_factory.mktemp("audit"), [], io.StringIO()

    def recording_audit_case(case, fixture):
        audits.append(rounding_audit.audit_case(case, fixture))
        return audits[-1]

    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed):
        patch.delenv("FORCE_COLOR", raising=False)
        patch.setattr(faults_cli, "audit_case", recording_audit_case)
        code = faults_cli.main(["--audit", "--cases", MLP_CASE, "--out", str(out)])
    return code, printed.getvalue(), out, {audit.case: audit for audit in audits}


@pytest.mark.parametrize("name", rounding_audit.AUDIT_CASES)
def test_every_bfloat16_value_of_the_reference_has_a_site(name):
    case = registry.get(name)
    values = rounding_audit.bfloat16_values(case, make_fixture(case))
    assert values, "a bfloat16 case holds bfloat16 values"
    assert not rounding_audit.unmodelled(values), [v.function for v in rounding_audit.unmodelled(values)]
    functions = {v.function for v in values}
    assert {"collapse_streams", "expand_streams", "fold_norm_into_projection"} <= functions


def test_a_function_without_a_site_is_reported(mlp_case, monkeypatch):
    modelled = {k: v for k, v in rounding_audit.MODELLED_BY.items() if k != "mlp_apply"}
    monkeypatch.setattr(rounding_audit, "MODELLED_BY", modelled)
    missing = rounding_audit.unmodelled(rounding_audit.bfloat16_values(*mlp_case))
    assert [v.function for v in missing] == ["mlp_apply"]
    assert "mhc_parity/cases/branches.py" in missing[0].location


def test_a_value_made_in_a_comprehension_is_its_functions():
    # Python 3.11 runs every comprehension in a frame of its own (3.12 still does for a
    # generator expression): the audit names the function the comprehension is written in,
    # as MODELLED_BY does ("MhcWeights.astype_for_compute" holds a dict comprehension).
    def narrow_each(leaves):
        by_name = {name: leaf.astype(jnp.bfloat16) for name, leaf in leaves.items()}
        return tuple(leaf * 2 for leaf in by_name.values())

    found = rounding_audit.bfloat16_equations(jax.make_jaxpr(narrow_each)({"a": jnp.ones(3)}))
    functions = {function for function, _, _ in found}
    assert functions == {f"{test_a_value_made_in_a_comprehension_is_its_functions.__name__}.<locals>.narrow_each"}
    assert sorted(p for primitives in found.values() for p in primitives) == ["convert_element_type", "mul"]


@pytest.mark.slow
def test_site_shares_name_what_a_leaf_rests_on(audit_run):
    # `site_shares(case, make_fixture(case))` as the audit command computed it for the mlp case.
    shares = audit_run[3][MLP_CASE].shares
    assert {"mlp_hidden", "mlp_preactivation", "coefficient_operand", "layer_input"} <= set(shares)
    # The collapse cancels on mixed_signs: layer_input's sensitivity is its operand rounding.
    assert shares["coefficient_operand"]["layer_input"] > 0.8
    # The MLP's hidden activation moves the bias gradient the 4-draw rule failed on, and the
    # branch's own gradients: what the model missed before.
    assert shares["mlp_hidden"]["d_pre_bias"] > 0.2 and shares["mlp_hidden"]["d_branch.w_out"] > 0.1
    assert all(0.0 <= share < 1.5 for by_leaf in shares.values() for share in by_leaf.values())


@pytest.mark.slow
def test_the_audit_command_writes_its_tables(audit_run):
    # The mlp mixed_signs case, one of AUDIT_CASES (an identity case showed the same before): its
    # layer_input rests on the coefficient operand's rounding, so that site's row is shown.
    code, printed, out, audits = audit_run
    assert code == 0, printed
    assert list(audits) == [MLP_CASE]
    text = (out / "rounding_audit.md").read_text()
    assert "Unmodelled: none." in text and "| `coefficient_operand` |" in text


def test_audit_refuses_to_be_combined_with_a_sweep(tmp_path):
    assert faults_cli.main(["--audit", "--seeds", "2", "--out", str(tmp_path)]) == 2
