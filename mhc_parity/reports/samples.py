"""A small, fixed, hand-made row set covering every verdict and report corner (a failure past its bound, NaN output, an
error row, skip, unsupported, lowering, HTML-hostile text), for tests, demos and docs.
"""

from __future__ import annotations

import math
from pathlib import Path

from mhc_parity.records import dtypes
from mhc_parity.records.manifest import COMPLETE, Manifest, RunRequest, now_iso, write_manifest
from mhc_parity.records.project_code import code_files, digest_of
from mhc_parity.records.rows import to_frame
from mhc_parity.records.schema import empty_row
from mhc_parity.records.store import case_records
from mhc_parity.reports.writers import OUTPUT_FILES, write_all, write_csv, write_json

HOSTILE_CASE = "<script>alert(1)</script>"
HOSTILE_REASON = "kernel raised: bad & <worse> \"quoted\" 'single'"

LEAVES = (
    ("out", "output"),
    ("h_pre", "intermediate"),
    ("d_x", "activation_grad"),
    ("d_pre_alpha", "weight_grad"),
    ("d_branch.w", "branch_grad"),
)


def measured_row(
    case: str,
    candidate: str,
    partner: str,
    comparison: str,
    leaf: str,
    leaf_kind: str,
    dtype: str,
    scale: float,
    **overrides,
) -> dict:
    """A passing row whose errors are `scale` ulps-ish of `dtype` (oracle ratio ~1)."""
    eps = dtypes.epsilon(dtype)
    partner_oracle = 0.0 if comparison == "vs_oracle" else 0.8 * scale * eps
    cand_oracle = scale * eps
    ratio = cand_oracle / partner_oracle if partner_oracle else math.inf
    row = empty_row(
        case=case,
        candidate=candidate,
        partner=partner,
        leaf=leaf,
        comparison=comparison,
        leaf_kind=leaf_kind,
        dtype=dtype,
        act_dtype=dtype,
        weight_dtype="float32",
        variant="lite",
        shape="2x64x4x128",
        mesh="data=2,fsdp=4" if "sharded" in candidate else "",
        tags="smoke " + dtype,
        verdict="pass",
        reason="",
        max_abs_err=0.5 * scale * eps,
        max_rel_err=scale * eps * 0.9,
        rel_rms_err=scale * eps * 0.3,
        max_ulp=scale,
        p99_ulp=max(scale / 2, 0.5),
        cosine=1.0 - scale * eps,
        cand_oracle_max_err=cand_oracle,
        partner_oracle_max_err=partner_oracle,
        oracle_ratio_max=ratio,
        cand_oracle_rms_err=0.3 * cand_oracle,
        partner_oracle_rms_err=0.3 * partner_oracle,
        oracle_ratio_rms=ratio,
        bound=f"ratio <= 2 or <= 4 ulp ({dtype})",
        bound_usage=min(scale / 4.0, 0.95),
        compile_s=0.12,
        execute_s=0.003,
    )
    row.update(overrides)
    return row


def sample_rows() -> list[dict]:
    """The hand-made row set (about 40 rows)."""
    rows = []
    comparisons = (
        ("interpret/unsharded", "reference/unsharded", "vs_reference"),
        ("interpret/sharded(data=2,fsdp=4)", "interpret/unsharded", "vs_unsharded"),
        ("interpret/unsharded", "oracle", "vs_oracle"),
    )
    for case, dtype in (("bf16_small", "bfloat16"), ("f32_small", "float32"), (HOSTILE_CASE, "float32")):
        for index, (leaf, kind) in enumerate(LEAVES):
            for candidate, partner, comparison in comparisons:
                rows.append(measured_row(case, candidate, partner, comparison, leaf, kind, dtype, 1.0 + index))
    # A bf16 weight gradient past its bound.
    for row in rows:
        if (row["case"], row["leaf"], row["comparison"]) == ("bf16_small", "d_pre_alpha", "vs_reference"):
            row.update(
                verdict="fail",
                bound_usage=1.7,
                oracle_ratio_max=3.4,
                reason="oracle ratio 3.4 > 2 and 7 ulp > 4 ulp",
                cause="the pre gate's scale and bias rounded to bfloat16",
                cause_id="round:gate_weight/pre_gate:forward:bfloat16",
                cause_explained=0.97,
            )
    # NaN in the candidate where the oracle has none: always a failure.
    rows.append(
        measured_row(
            "bf16_nan",
            "interpret/unsharded",
            "reference/unsharded",
            "vs_reference",
            "out",
            "output",
            "bfloat16",
            1.0,
            verdict="fail",
            nan_count=3,
            max_abs_err=math.nan,
            max_rel_err=math.nan,
            rel_rms_err=math.nan,
            max_ulp=math.nan,
            p99_ulp=math.nan,
            cosine=math.nan,
            cand_oracle_max_err=math.nan,
            oracle_ratio_max=math.nan,
            cand_oracle_rms_err=math.nan,
            oracle_ratio_rms=math.nan,
            bound_usage=math.inf,
            reason="3 NaN in candidate, 0 in oracle",
        )
    )
    # An exception: empty metrics, hostile text in the reason.
    rows.append(
        empty_row(
            case=HOSTILE_CASE,
            candidate="ext/unsharded",
            partner="reference/unsharded",
            leaf="out",
            comparison="vs_reference",
            leaf_kind="output",
            dtype="float32",
            act_dtype="float32",
            weight_dtype="float32",
            variant="lite",
            shape="2x64x4x128",
            verdict="error",
            reason=HOSTILE_REASON,
        )
    )
    # Mosaic off-TPU, an expected unsupported input, a lowering program.
    rows.append(
        empty_row(
            case="f32_small",
            candidate="mosaic/unsharded",
            partner="reference/unsharded",
            leaf="out",
            comparison="vs_reference",
            leaf_kind="output",
            dtype="float32",
            act_dtype="float32",
            weight_dtype="float32",
            variant="lite",
            shape="2x64x4x128",
            verdict="skip",
            reason="needs a TPU backend",
        )
    )
    rows.append(
        empty_row(
            case="odd_streams",
            candidate="interpret/unsharded",
            partner="reference/unsharded",
            leaf="out",
            comparison="vs_reference",
            leaf_kind="output",
            dtype="bfloat16",
            act_dtype="bfloat16",
            weight_dtype="float32",
            variant="lite",
            shape="2x60x3x128",
            verdict="unsupported",
            reason="UnsupportedInputError: sequence 60 not a multiple of block 64",
        )
    )
    rows.append(
        empty_row(
            case="f32_small",
            candidate="lowering",
            partner="mosaic",
            leaf="pre_fwd",
            comparison="lowering",
            leaf_kind="program",
            dtype="float32",
            act_dtype="float32",
            weight_dtype="float32",
            variant="lite",
            shape="2x64x4x128",
            verdict="pass",
            bound="lowers to Mosaic",
            compile_s=0.8,
        )
    )
    return rows


def run_request(**changes) -> RunRequest:
    """A `run` request as the command line without options makes it, with `changes`."""
    fields = dict(
        suite=None,
        case_globs=None,
        tags=None,
        dtype=None,
        case_files=(),
        seed=None,
        paths=("*",),
        implementations=(),
        lowering=True,
    )
    return RunRequest(**{**fields, **changes})


def sample_manifest(rows, *, policy_digest: str = "sample-policy"):
    """A complete `Manifest` for a hand-made row set, as `mhc-parity run` would make it with this checkout's code."""
    cases = tuple(dict.fromkeys(str(r["case"]) for r in rows))
    files = code_files()
    stamp = now_iso()
    request = run_request(case_globs=cases)
    records = case_records(rows, cases)
    return Manifest(
        run_id=f"sample-{len(rows)}-rows",
        state=COMPLETE,
        request=request,
        cases=cases,
        selection_digest="sample",
        path_names=tuple(sorted({str(r["candidate"]) for r in rows})),
        policy_source="sample",
        policy_digest=policy_digest,
        code_digest=digest_of(files),
        code_files=tuple(files.items()),
        command_line="(hand-made sample run)",
        started=stamp,
        updated=stamp,
        finished=stamp,
        case_records=tuple(records[case] for case in cases),
        rows=len(rows),
    )


def write_sample_run(
    rows,
    folder,
    *,
    metadata=None,
    policy_digest: str = "sample-policy",
    rendered: bool = True,
    manifest=None,
    **options,
):
    """`rows` as a complete run folder (reports, then manifest.json); returns `write_all`'s paths, `options` going to
    it. rendered=False writes only rows.csv and report.json; manifest: the run's, when not `sample_manifest`'s."""
    manifest = manifest or sample_manifest(rows, policy_digest=policy_digest)
    folder = Path(folder)
    if rendered:
        paths = write_all(rows, metadata, folder, manifest=manifest, **options)
    else:
        folder.mkdir(parents=True, exist_ok=True)
        frame = to_frame(rows)
        paths = {
            "csv": write_csv(frame, folder / OUTPUT_FILES["csv"]),
            "json": write_json(
                frame,
                dict(metadata or {}, **manifest.naming_fields()),
                folder / OUTPUT_FILES["json"],
                manifest=manifest,
            ),
        }
    write_manifest(folder, manifest)
    return paths
