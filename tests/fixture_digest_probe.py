"""Probe run by tests/test_fixtures.py under `pytest -n 2 --dist each` (not collected by default).

Every xdist worker makes the fixtures of the same cases through one shared cache folder
(racing on the atomic writes) and records the digests it saw; the outer test checks
that all workers saw the same bits. Environment: FIXTURE_PROBE_CACHE, FIXTURE_PROBE_OUT.
"""

import os
import pathlib

import pytest

from mhc_parity.cases.fixtures import make_fixture
from mhc_parity.cases.spec import Case

PROBE_CASES = [
    Case(name="probe-f32", batch=2, sequence=64, streams=4, embedding=128, branch="mlp"),
    Case(
        name="probe-bf16", batch=2, sequence=64, streams=3, embedding=128, dtype="bfloat16", init="bf16_inexact_gates"
    ),
    Case(
        name="probe-sinkhorn",
        batch=1,
        sequence=128,
        streams=4,
        embedding=256,
        variant="sinkhorn",
        weight_dtype="bfloat16",
        init="near_zero_rms",
    ),
]


@pytest.mark.parametrize("case", PROBE_CASES, ids=lambda c: c.name)
def test_record_digest(case):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    fixture = make_fixture(case, cache_dir=os.environ["FIXTURE_PROBE_CACHE"])
    out = pathlib.Path(os.environ["FIXTURE_PROBE_OUT"])
    (out / f"{worker}--{case.name}").write_text(fixture.digest())
