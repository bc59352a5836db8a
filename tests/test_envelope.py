"""Implementation envelopes, whole-layer implementations and factories of several.

Fast: nothing here compiles a kernel. The MaxText verdicts are in tests/test_maxtext.py.
"""

from __future__ import annotations

import types

import pytest

from mhc_parity.cases.catalogue import make_case
from mhc_parity.harness.engine.envelope import Envelope
from mhc_parity.harness.engine.failures import last_frame
from mhc_parity.harness.engine.implementations import (
    ImplementationError,
    load_externals,
    load_implementations,
    wrap_external,
)
from mhc_parity.harness.engine.paths import Path
from mhc_parity.harness.engine.plan import PathPlan, comparisons_of
from mhc_parity.harness.engine.runner import Runner
from mhc_parity.harness.engine.selection import inside_envelopes
from mhc_parity.harness.errors import UsageError
from mhc_parity.harness.judging.policy_file import load_policy

BF16_CASE = make_case(batch=2, sequence=128, dtype="bfloat16", block_tokens=64, block_tokens_bwd=32)
ENVELOPE = Envelope(
    act_dtypes=("bfloat16",),
    streams=(4,),
    variants=("lite",),
    embedding_multiple=128,
    token_multiple=lambda case: case.block_tokens or 256,
)


def test_an_envelope_names_what_is_outside_it():
    assert ENVELOPE.reason(BF16_CASE) == ""
    assert "activation dtype float32" in ENVELOPE.reason(make_case(dtype="float32"))
    assert "stream count 3" in ENVELOPE.reason(make_case(streams=3, dtype="bfloat16"))
    assert "variant sinkhorn" in ENVELOPE.reason(make_case(variant="sinkhorn", dtype="bfloat16"))
    assert "embedding 96 is not a multiple of 128" in ENVELOPE.reason(make_case(embedding=96, dtype="bfloat16"))
    # 128 tokens and no explicit block: the case-dependent multiple (256) applies.
    assert "128 tokens is not a multiple of 256" in ENVELOPE.reason(make_case(dtype="bfloat16"))


def test_token_multiples_count_the_tokens_one_device_holds():
    case = make_case(batch=2, sequence=256, dtype="bfloat16", mesh=(2, 4), block_tokens=128)
    assert ENVELOPE.reason(case) == ""  # 512 tokens unsharded
    assert "64 tokens per device of a 2x4 mesh is not a multiple of 128" in ENVELOPE.reason(case, (2, 4))
    assert ENVELOPE.case_reason(case) == ENVELOPE.reason(case, (2, 4))
    assert "the 2x4 mesh is outside the envelope (meshes: none" in Envelope(meshes=()).reason(case, (2, 4))
    assert Envelope(meshes=((2, 4),)).reason(case, (2, 4)) == ""
    assert "(meshes: 8x1)" in Envelope(meshes=((8, 1),)).reason(case, (2, 4))


class _WholeLayer:
    """A whole-layer implementation that must never be called outside its envelope."""

    name = "whole"
    envelope = ENVELOPE

    def build(self, case, *, matmul_precision, mesh):
        raise AssertionError("built for a case outside the envelope")


def _rows(impl, case):
    plan = PathPlan(implementations=(impl,), lowering=False)
    return list(Runner(load_policy()).run_case(case, plan))


def test_a_case_outside_the_envelope_is_unsupported_rows_and_never_runs():
    impl = wrap_external(_WholeLayer())
    assert impl.layer is not None and impl.external is None
    rows = _rows(impl, make_case(dtype="float32", embedding=96))
    assert rows and {r["verdict"] for r in rows} == {"unsupported"}
    assert all("whole: embedding 96" in r["reason"] or "whole: activation dtype" in r["reason"] for r in rows)


def test_a_rejection_inside_the_envelope_fails():
    from mhc_parity.mhc.common import UnsupportedInputError

    class Rejecting(_WholeLayer):
        def build(self, case, *, matmul_precision, mesh):
            raise UnsupportedInputError("no, thanks")

    rows = _rows(wrap_external(Rejecting()), BF16_CASE)
    assert rows and {r["verdict"] for r in rows} == {"fail"}
    assert all("rejected a supported case: no, thanks" in r["reason"] for r in rows)


def test_inside_envelope_keeps_the_cases_every_envelope_holds():
    impl = wrap_external(_WholeLayer())
    outside = make_case(dtype="float32")
    assert inside_envelopes([BF16_CASE, outside], (impl,)) == [BF16_CASE]
    with pytest.raises(UsageError, match="no selected case is inside every envelope"):
        inside_envelopes([outside], (impl,))
    without = wrap_external(types.SimpleNamespace(name="plain", pre=lambda *a, **k: None, post=lambda *a, **k: None))
    with pytest.raises(UsageError, match="declares an envelope"):
        inside_envelopes([BF16_CASE], (without,))


def _factory_of_two():
    return [
        types.SimpleNamespace(name="kern", partner="ref", build=lambda *a, **k: None),
        types.SimpleNamespace(name="ref", build=lambda *a, **k: None),
    ]


def _factory_with_a_missing_partner():
    return [types.SimpleNamespace(name="kern", partner="nobody", build=lambda *a, **k: None)]


def test_a_factory_may_give_several_implementations_and_a_partner_among_them():
    loaded = load_externals([f"{__name__}:_factory_of_two"])
    assert [impl.name for impl in loaded] == ["kern", "ref"]
    kern, ref = loaded
    planned = [Path(kern), Path(ref)]
    assert ("vs_reference", "ref/unsharded") in comparisons_of(Path(kern), planned)
    with pytest.raises(ImplementationError, match="names partner 'nobody'"):
        load_externals([f"{__name__}:_factory_with_a_missing_partner"])
    assert len(load_implementations(f"{__name__}:_factory_of_two")) == 2


def test_an_error_row_names_the_innermost_frame_of_the_implementation_code(tmp_path):
    code = tmp_path / "pkg" / "inner.py"
    code.parent.mkdir()
    code.write_text("def boom():\n    raise RuntimeError('x')\n")
    namespace: dict = {}
    exec(compile(code.read_text(), str(code), "exec"), namespace)
    try:
        namespace["boom"]()
    except RuntimeError as exc:
        assert last_frame(exc, str(tmp_path / "pkg")) == " (at pkg/inner.py:2 in boom)"
        assert last_frame(exc) == " (at inner.py:2)"


def test_the_api_filters_a_suite_to_the_envelope():
    from mhc_parity.harness.api import prepare

    prepared = prepare(_WholeLayer(), suite="default", inside_envelope=True)
    assert prepared.cases and all(ENVELOPE.case_reason(case) == "" for case in prepared.cases)
    assert len(prepared.cases) < len(prepare(_WholeLayer(), suite="default").cases)
