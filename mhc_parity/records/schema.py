"""The row schema, one row per (case, candidate path, partner path, leaf): the one source of the column names the
runner, the gate and the reports share. A row is a flat dict with exactly `ROW_COLUMNS`; metrics are floats (NaN where
they do not apply), counts ints. Plain Python: the reports import it without JAX.
"""

from __future__ import annotations

from types import MappingProxyType


class ReportInputError(ValueError):
    """A row set or row file that does not match the schema (message names where)."""


VERDICTS = ("pass", "fail", "skip", "unsupported", "error")
# Verdicts that do not break a run (exit code 0).
OK_VERDICTS = ("pass", "skip", "unsupported")
# Verdicts of rows that measured something; a run with none of them checked nothing.
COMPARED_VERDICTS = ("pass", "fail")

# How a candidate path is compared:
#   vs_reference  kernel/external path vs the reference path, same sharding
#   vs_unsharded  a token-sharded path vs the same implementation unsharded
#   vs_oracle     any path vs the float64 oracle
#   lowering      the Mosaic-lowering check (one row per program, leaf = program name)
#   compile       the TPU compiler's check, for a named TPU target (one row per program)
COMPARISONS = ("vs_reference", "vs_unsharded", "vs_oracle", "lowering", "compile")
# Judged by the toolchain (a program lowers / compiles or not): no tolerance rule, no error metrics.
PROGRAM_COMPARISONS = ("lowering", "compile")

# Leaf kinds, the policy's second axis:
#   output           the operation's output, `out`
#   intermediate     the operation's other forward leaves
#   activation_grad  d_x
#   weight_grad      d_<weight name> (matrices, biases, norm scale)
#   scale_grad       gradients of scalar scales: sums over every token and stream with both
#                    signs, whose cancellation amplifies their relative error
#   branch_grad      d_branch.<branch parameter>
#   program          a lowering or compile row's program
LEAF_KINDS = (
    "output",
    "intermediate",
    "activation_grad",
    "weight_grad",
    "scale_grad",
    "branch_grad",
    "program",
)

IDENTITY_COLUMNS = ("case", "candidate", "partner", "leaf")
# A failing row's `cause_id` when no hypothesis explains its error (mhc_parity.harness.judging.attribution).
UNEXPLAINED_CAUSE = "unexplained"

_FLOAT, _INT, _TEXT = float, int, str  # the types of row values
# Every row column, in order, with the type of its values.
_COLUMN_TYPES = {
    # identity: the key a baseline row is matched on is IDENTITY_COLUMNS
    "case": _TEXT,
    "candidate": _TEXT,
    "partner": _TEXT,
    "leaf": _TEXT,
    "comparison": _TEXT,
    "leaf_kind": _TEXT,
    # what was compared
    "dtype": _TEXT,  # dtype of the compared leaf (the candidate's)
    "act_dtype": _TEXT,
    "weight_dtype": _TEXT,
    "variant": _TEXT,
    "shape": _TEXT,  # e.g. "2x64x4x128"
    "mesh": _TEXT,  # "" unsharded, else "data=2,fsdp=4"
    "tags": _TEXT,  # space-separated
    # verdict
    "verdict": _TEXT,
    "reason": _TEXT,  # why it failed / skipped / errored; "" on a clean pass
    # candidate vs partner
    "max_abs_err": _FLOAT,
    "max_rel_err": _FLOAT,  # max |c - p| / max |p|
    "rel_rms_err": _FLOAT,  # ||c - p||_2 / ||p||_2
    "max_ulp": _FLOAT,  # in ulps of the leaf's dtype at the partner's values
    "p99_ulp": _FLOAT,
    "cosine": _FLOAT,
    "nan_count": _INT,  # in the candidate
    "inf_count": _INT,
    "partner_nan_count": _INT,
    "partner_inf_count": _INT,
    "oracle_nan_count": _INT,
    "oracle_inf_count": _INT,
    # each side against the float64 oracle (same normalisation as max_rel_err / rel_rms_err)
    "cand_oracle_max_err": _FLOAT,
    "partner_oracle_max_err": _FLOAT,
    "oracle_ratio_max": _FLOAT,  # cand_oracle_max_err / partner_oracle_max_err
    "cand_oracle_rms_err": _FLOAT,
    "partner_oracle_rms_err": _FLOAT,
    "oracle_ratio_rms": _FLOAT,
    # how far the rounding model moves the oracle's leaf (same normalisations)
    "oracle_sensitivity_max": _FLOAT,
    "oracle_sensitivity_rms": _FLOAT,
    # signed gain <c - o, o> / <o, o> (a leaf scaled by 1 + g has gain g); the model's RMS gain
    "cand_oracle_gain": _FLOAT,
    "partner_oracle_gain": _FLOAT,
    "oracle_sensitivity_gain": _FLOAT,
    # max|oracle| / ‖oracle‖₂ (1/√N_eff; mhc_parity.records.gain_rule)
    "oracle_peak_to_l2": _FLOAT,
    # how well the sensitivity is known: effective degrees of freedom, rounding draws
    "oracle_sensitivity_dof_max": _FLOAT,
    "oracle_sensitivity_dof_rms": _FLOAT,
    "oracle_draws": _FLOAT,
    # q: a correct path's error exceeds q x the sensitivity with the policy's stated rate p
    # (1 if it states none; mhc_parity.records.rate_quantiles)
    "oracle_quantile_max": _FLOAT,
    "oracle_quantile_rms": _FLOAT,
    # an error shared by every token (token-major leaves, vs the oracle): the largest per-group t
    # of the mean error, that group's shift (/ max|oracle|), the partner's and the model's t; the
    # shift the backend's primitives may share on every token (NaN where it has no term, a CPU)
    "cand_systematic_t": _FLOAT,
    "cand_systematic_shift": _FLOAT,
    "partner_systematic_t": _FLOAT,
    "oracle_systematic_t": _FLOAT,
    "oracle_backend_shift": _FLOAT,
    # the bound the row was held to
    "bound": _TEXT,  # human-readable description of the rule and its numbers
    "bound_usage": _FLOAT,  # measured / allowed for the binding rule; > 1 fails
    # bound_usage = |row[bound_metric]| / allowed_error; NaN and "" where no bound applied
    "allowed_error": _FLOAT,
    "bound_metric": _TEXT,
    # a failing row's most likely cause: words, hypothesis names ("+" between two; "unexplained"),
    # the fraction of the squared error vs the oracle it explains (records.cause_consistency)
    "cause": _TEXT,
    "cause_id": _TEXT,
    "cause_explained": _FLOAT,
    # seconds of the candidate's program (forward and VJP): compile or load; execute_s one run on a
    # host CPU, else device time per run of `execute_runs` after warm-up; execute_first_s the first call
    "compile_s": _FLOAT,
    "execute_s": _FLOAT,
    "execute_first_s": _FLOAT,
    "execute_runs": _FLOAT,  # a count; NaN where the candidate did not run (or before the column)
    # bytes of the program's arguments and results: the least it must move (records.roofline)
    "bytes_moved": _FLOAT,
    # the matmul precision it effectively ran at ("highest (default requested; cpu default is full
    # float32)") and its devices ("cpu:0-7"; "" if it did not run)
    "matmul_precision": _TEXT,
    "devices": _TEXT,
    # this project's kernels' blocks for one shard of the tokens, e.g. "block_tokens=128
    # block_tokens_bwd=64 block_features=512"; "" on rows of other paths
    "kernel_blocks": _TEXT,
    # the oracle's own process's peak resident bytes (NaN where the run's process computed it)
    # and the budget the case-memory estimate gives it
    "oracle_peak_bytes": _FLOAT,
    "oracle_budget_bytes": _FLOAT,
    # compile rows only: the TPU target ("v5e (v5e=2x4)"), a failure's cause class ("precision",
    # "vmem", ...), a VMEM overflow's bytes asked and allowed, the program's memory figures
    "target": _TEXT,
    "compile_cause": _TEXT,
    "vmem_asked_bytes": _FLOAT,
    "vmem_allowed_bytes": _FLOAT,
    "code_bytes": _FLOAT,
    "argument_bytes": _FLOAT,
    "output_bytes": _FLOAT,
    "temp_bytes": _FLOAT,
}

ROW_COLUMNS = tuple(_COLUMN_TYPES)
# Of the candidate's program, not what it computed: runs of the same rows may differ in them, and
# the judged-row store and the causes ignore them.
TIMING_COLUMNS = ("compile_s", "execute_s", "execute_first_s", "execute_runs", "bytes_moved")

# Added after the first schema: older row files lack them and are read with them empty.
LATER_COLUMNS = (
    "cand_systematic_t",
    "cand_systematic_shift",
    "partner_systematic_t",
    "oracle_systematic_t",
    "matmul_precision",
    "devices",
    "cand_oracle_gain",
    "partner_oracle_gain",
    "oracle_sensitivity_gain",
    "oracle_sensitivity_dof_max",
    "oracle_sensitivity_dof_rms",
    "oracle_draws",
    "cause",
    "cause_id",
    "cause_explained",
    "allowed_error",
    "bound_metric",
    "oracle_quantile_max",
    "oracle_quantile_rms",
    "target",
    "compile_cause",
    "vmem_asked_bytes",
    "vmem_allowed_bytes",
    "code_bytes",
    "argument_bytes",
    "output_bytes",
    "temp_bytes",
    "execute_first_s",
    "execute_runs",
    "oracle_backend_shift",
    "kernel_blocks",
    "oracle_peak_bytes",
    "oracle_budget_bytes",
    "bytes_moved",
    "oracle_peak_to_l2",
)

COLUMN_TYPES = MappingProxyType(_COLUMN_TYPES)
FLOAT_COLUMNS = tuple(c for c, kind in _COLUMN_TYPES.items() if kind is _FLOAT)
INT_COLUMNS = tuple(c for c, kind in _COLUMN_TYPES.items() if kind is _INT)
TEXT_COLUMNS = tuple(c for c, kind in _COLUMN_TYPES.items() if kind is _TEXT)


def row_key(row: dict) -> tuple[str, str, str, str]:
    """The identity of a row across runs: (case, candidate, partner, leaf)."""
    return tuple(str(row[c]) for c in IDENTITY_COLUMNS)  # type: ignore[return-value]


def empty_row(**fields) -> dict:
    """A row with every column present: NaN metrics, zero counts, empty text, then `fields`."""
    unknown = set(fields) - set(ROW_COLUMNS)
    if unknown:
        raise KeyError(f"unknown row columns: {sorted(unknown)}")
    row: dict = {c: "" for c in TEXT_COLUMNS}
    row.update({c: float("nan") for c in FLOAT_COLUMNS})
    row.update({c: 0 for c in INT_COLUMNS})
    row.update(fields)
    return row
