"""The row schema: one row per (case, candidate path, partner path, leaf).

This module is the single source of the column names shared by the runner (which
writes rows), the gate (which compares two row sets) and `mhc_parity/reports/` (which renders
them). It is plain Python on purpose: `mhc_parity/reports/` imports it without loading JAX.

A row is a flat dict with exactly `ROW_COLUMNS` as keys. Metric columns hold floats
(NaN where a metric does not apply, e.g. on skip/error rows); count columns hold ints.
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
# Comparisons judged by the toolchain itself (a program lowers / compiles or not), one row per
# program (leaf kind "program"): no tolerance rule, no error metrics.
PROGRAM_COMPARISONS = ("lowering", "compile")

# Leaf kinds, the policy's second axis:
#   output           the operation's output, `out`
#   intermediate     what a path materialises on the way (the operation's other forward
#                    leaves, `mhc_parity.harness.engine.operation`)
#   activation_grad  d_x
#   weight_grad      d_<weight name> (matrices, biases, norm scale)
#   scale_grad       the gradients of scalar scales that sum over every token and stream
#                    with both signs, so cancellation amplifies their relative error far
#                    beyond other weight gradients' (the operation says which weights)
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
    # how far one rounding of the activation dtype at every operation moves the oracle's
    # leaf (same normalisations): the error the arithmetic explains at this leaf
    "oracle_sensitivity_max": _FLOAT,
    "oracle_sensitivity_rms": _FLOAT,
    # the error's component along the oracle's own value, <c - o, o> / <o, o> (signed): a
    # leaf scaled by 1 + g has gain g; and the rounding model's root-mean-square gain
    "cand_oracle_gain": _FLOAT,
    "partner_oracle_gain": _FLOAT,
    "oracle_sensitivity_gain": _FLOAT,
    # max|oracle| / ‖oracle‖₂ (1/√N_eff): an element floor times it is the gain's floor
    # (mhc_parity.records.gain_rule)
    "oracle_peak_to_l2": _FLOAT,
    # how well the sensitivity is known: the effective degrees of freedom of the squared max
    # and RMS deviations, and how many rounding draws they come from
    "oracle_sensitivity_dof_max": _FLOAT,
    "oracle_sensitivity_dof_rms": _FLOAT,
    "oracle_draws": _FLOAT,
    # q of the policy's stated false-positive rate p for those degrees of freedom and draws
    # (mhc_parity.harness.judging.confidence.quantile; 1 under a policy that states no rate):
    # a correct path's error exceeds q x the sensitivity with probability p. The gate's
    # growth rule reads them (mhc_parity.reports.drift)
    "oracle_quantile_max": _FLOAT,
    "oracle_quantile_rms": _FLOAT,
    # an error shared by every token (token-major leaves, against the oracle): the largest
    # per-group t statistic |mean error| / standard error, that group's mean shift
    # (normalised by max|oracle|), the partner's t, and the t the rounding model produces;
    # the shift the backend's own primitives may share (every one off by its whole model
    # term, the same way on every token; NaN where the backend has no term, as on a CPU)
    "cand_systematic_t": _FLOAT,
    "cand_systematic_shift": _FLOAT,
    "partner_systematic_t": _FLOAT,
    "oracle_systematic_t": _FLOAT,
    "oracle_backend_shift": _FLOAT,
    # the bound the row was held to
    "bound": _TEXT,  # human-readable description of the rule and its numbers
    "bound_usage": _FLOAT,  # measured / allowed for the binding rule; > 1 fails
    # that binding criterion's limit as a number, and the column it holds (its size, for the
    # signed cand_oracle_gain): bound_usage = |row[bound_metric]| / allowed_error. NaN and ""
    # where no bound was applied (skip, unsupported, error, lowering and non-finite rows)
    "allowed_error": _FLOAT,
    "bound_metric": _TEXT,
    # a failing row's most likely cause (mhc_parity.harness.engine.causes; "" on other rows): in words,
    # the names of its hypotheses ("+" between two; "unexplained" when none), and the
    # fraction of the candidate's squared error against the oracle that it explains. A finished
    # run's files state a rounding whose place does not hold across its implementation's
    # failing leaves as "unexplained", its words and id in the cause, its fraction kept
    # (mhc_parity.records.cause_consistency; the row stream keeps what the case named)
    "cause": _TEXT,
    "cause_id": _TEXT,
    "cause_explained": _FLOAT,
    # timing (seconds) of the candidate's one program, forward and VJP together: obtaining it
    # (compile or load), and running it. On the host CPU the program runs once and execute_s
    # is that run; on an accelerator execute_s is the device time per run of `execute_runs`
    # runs back to back after warm-up, timed with the process quiet (a run before issue 55's
    # fix: the median of 5 runs, with the run's background work beside them), and
    # execute_first_s the first call (mhc_parity.harness.engine.execution_timing)
    "compile_s": _FLOAT,
    "execute_s": _FLOAT,
    "execute_first_s": _FLOAT,
    "execute_runs": _FLOAT,  # a count; NaN where the candidate did not run (or before the column)
    # the bytes of the program's arguments and results: what it must move at least
    # (mhc_parity.records.roofline; the report's Speed section divides it by execute_s)
    "bytes_moved": _FLOAT,
    # where and how the candidate ran: the matmul precision it effectively ran at (see
    # mhc_parity.mhc.precision; e.g. "highest (default requested; cpu default is full float32)")
    # and its devices (e.g. "cpu:0-7"; "" if it did not run; see mhc_parity.harness.engine.devices)
    "matmul_precision": _TEXT,
    "devices": _TEXT,
    # the blocks this project's kernels ran (interpret and mosaic paths, lowering and compile
    # rows), as the kernels resolve them for one shard of the tokens (Mosaic's fitted to the
    # scoped VMEM limit), e.g. "block_tokens=128 block_tokens_bwd=64 block_features=512"; ""
    # on every other row (mhc_parity.harness.engine.kernel_blocks)
    "kernel_blocks": _TEXT,
    # the case's float64 oracle: the peak resident memory (bytes) of the process that computed
    # its answer alone (a case large enough to get a process of its own,
    # mhc_parity.harness.engine.oracle_process; NaN where the run's own process computed it, and
    # on lowering and compile rows), and the budget the case-memory estimate gives it
    # (mhc_parity.harness.engine.case_memory.oracle_memory_bytes)
    "oracle_peak_bytes": _FLOAT,
    "oracle_budget_bytes": _FLOAT,
    # compile rows (comparison "compile", mhc_parity.harness.engine.compile_rows): the TPU target
    # compiled for (e.g. "v5e (v5e=2x4)"), a failure's cause class ("precision", "vmem",
    # "partitioning", "unsupported op", "other"), a VMEM overflow's bytes asked and allowed,
    # and the compiled program's memory figures in bytes; "" / NaN on every other row
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
# The columns of the candidate's program, not of what it computed: how long this run took, how
# it was timed (the repeats depend on the device the path ran on) and the bytes it moved. Two
# runs of the same rows may differ in them; a judged row's store and causes ignore them.
TIMING_COLUMNS = ("compile_s", "execute_s", "execute_first_s", "execute_runs", "bytes_moved")

# Columns added after the first schema: a row file written before them lacks them and
# is read with them empty (NaN for numbers; mhc_parity.records.rows), so older runs stay readable.
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

# Each column's cell type (float, int or str), read-only: what a reader coerces a cell to.
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
