"""`mhc-parity policy`: every resolved bound as a table, and docs/tolerances.md kept current."""

from __future__ import annotations

import pathlib

from mhc_parity.harness.cli import main as cli_main
from mhc_parity.harness.commands.policy import DOC_PATH, markdown, matrix_judgements, table_lines
from mhc_parity.harness.engine.plan import JudgementKey
from mhc_parity.harness.judging.policy_file import load_policy, parse_policy

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_docs_tolerances_is_what_the_policy_resolves_to():
    policy = load_policy()
    expected = markdown(policy, table_lines(policy, matrix_judgements()))
    assert (ROOT / DOC_PATH).read_text(encoding="utf-8") == expected, (
        f"{DOC_PATH} is stale: regenerate it with `make tolerances` and commit it with the policy change"
    )


def test_every_judgement_of_the_matrix_has_a_line_and_partitionings_share_one_only_when_equal():
    policy = load_policy()
    judgements = matrix_judgements()
    lines = table_lines(policy, judgements)
    covered = {
        (line.key.comparison, p, line.key.act_dtype, line.key.dtype, line.key.leaf_kind)
        for line in lines
        for p in line.partitionings
    }
    assert covered == {(k.comparison, k.partitioning, k.act_dtype, k.dtype, k.leaf_kind) for k in judgements}
    for line in lines:
        bounds = {
            JudgementKey(line.key.comparison, p, line.key.act_dtype, line.key.dtype, line.key.leaf_kind).resolve(policy)
            for p in line.partitionings
        }
        assert bounds == {line.resolved}
    # the matrix judges both partitionings, and the systematic criterion only on intermediates
    assert {p for line in lines for p in line.partitionings} == {"manual", "auto"}
    for line in lines:
        assert ("systematic" in line.resolved.bound.describe()) == (
            line.key.leaf_kind == "intermediate" and line.resolved.rule.kind == "oracle_ratio"
        ), line


def test_policy_command_checks_prints_the_table_and_refuses_a_policy_with_gaps(tmp_path, capsys):
    assert cli_main(["policy"]) == 0
    assert "rules resolve all" in capsys.readouterr().out
    assert cli_main(["policy", "--table"]) == 0
    table = capsys.readouterr().out
    assert "vs_unsharded  manual        float32    float32     output           exact" in table
    gappy = tmp_path / "gappy.toml"
    gappy.write_text(
        'version = 2\n[[rule]]\ncomparison = "vs_oracle"\ndtype = "*"\nleaf_kind = "*"\n'
        'kind = "ulps_of_max"\nmax_rel_ulps = 4\nrationale = "only vs_oracle"\n'
    )
    assert cli_main(["policy", "--table", "--policy", str(gappy)]) == 2
    assert "no tolerance rule" in capsys.readouterr().err


def test_a_changed_number_moves_its_lines():
    policy = load_policy()
    text = (ROOT / "mhc_parity" / "harness" / "judging" / "tolerances.toml").read_text(encoding="utf-8")
    changed = parse_policy(
        text.replace("max_rel_ulps = 64\nratio_sensitivity = 16", "max_rel_ulps = 65\nratio_sensitivity = 16", 1)
    )
    judgements = matrix_judgements()
    before, after = (markdown(p, table_lines(p, judgements)).splitlines() for p in (policy, changed))
    moved = [line for line in after if line not in before]
    assert moved and all("65ulp" in line or "max_rel_ulps = 65" in line for line in moved), moved
