"""The committed baseline stays consistent with the code that gates against it."""

import pathlib

from cases import registry
from harness.policy import load_policy
from reports import load_baseline

BASELINE = pathlib.Path(__file__).resolve().parent.parent / "baselines" / "default.csv"


def test_committed_baseline_was_made_under_the_current_policy():
    """A tolerance change must come with `make baseline` (the gate refuses a hash mismatch)."""
    baseline = load_baseline(BASELINE)
    assert baseline.policy_hash == load_policy().digest, (
        "harness/tolerances.toml changed since baselines/default.csv was written: run `make baseline`"
    )


def test_committed_baseline_covers_the_default_suite_and_passes():
    frame = load_baseline(BASELINE).frame
    assert set(frame["case"]) == {case.name for case in registry.default_registry().select(suite="default")}
    assert set(frame["verdict"]) <= {"pass", "skip", "unsupported"}
