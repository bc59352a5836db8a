"""The seam between the engine and the operation under test: the engine, the judging and the reports
name no leaf or weight of the mHC layer, and ask `OPERATION` (served by `mhc_parity.mhc.operation`).
A second operation is one more package serving `Operation`."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from mhc_parity.mhc import operation as mhc_operation


class LayerBuilder(Protocol):
    """How a path's forward is built: `build(case, *, matmul_precision, mesh)` returns
    `forward(x, weights, branch_fn) -> (out, intermediates)`, weights by name, intermediates
    by forward-leaf name."""

    def build(self, case, *, matmul_precision: str, mesh) -> Callable: ...


class OracleDraw(Protocol):
    """One draw of the float64 oracle: forward leaves, and the gradients of x, of every
    weight and of every branch parameter, as NumPy float64."""

    forward: Mapping[str, np.ndarray]
    d_x: np.ndarray
    d_weights: Mapping[str, np.ndarray]
    d_branch: Mapping[str, np.ndarray]


class Hypothesis(Protocol):
    """A candidate cause of a failing leaf: a stable `name`, its `label` in words, its `kind`
    ("rounding": a rounding the model does not allow, matched value for value; "accumulation":
    an order-dependent narrow sum, matched by size, `mhc_parity.harness.judging.attribution.SIZE_MATCHED_KINDS`;
    "fitted": an error of any size per token at one place, `mhc_parity.harness.judging.attribution.FITTED_KIND`),
    its `family` (the place it changes: two hypotheses of one family are never combined),
    whether it is `ordered` (its error depends on the order of a sum: two paths that sum in
    different orders differ by it), and `backend_sum_weights`: the weights whose gradients it
    sums in the order of the backend its draws run on (the host's), which a path on another
    backend does not share."""

    name: str
    label: str
    kind: str
    family: str
    ordered: bool
    backend_sum_weights: tuple[str, ...]


@runtime_checkable
class Operation(Protocol):
    """What the engine asks of the operation under test.

    FORWARD_LEAVES: the leaves a path returns besides gradients, the output first.
    WEIGHT_NAMES: the weights (their gradients are the leaves d_<name>).
    forward_leaf_dtypes(act_dtype): forward leaf -> dtype name. forward_leaf_kind(leaf):
    "output" or "intermediate". weight_kind(name): the gradient's leaf kind, "weight_grad"
    or "scale_grad". layer_builder(kernel=, interpret=, external=): the `LayerBuilder` of a
    built-in path or of an external pre/post implementation. oracle_draws(case, fixture,
    branch, draws): the oracle's `OracleDraw`s for the case's branch (its apply and the
    rounding sites it declares), draws as (seed, units), (0, None)
    exact. oracle_chunks(case, fixture, branch, draws, chunk_tokens, in_flight, room, other_units):
    the same draws run `chunk_tokens` tokens at a time (up to `in_flight` chunks at once, on threads,
    while `room()` allows; the values the same), an iterator of chunks in token order, each with its
    `start` and `stop` (a range of the flattened token axes) and its `results`: per draw an
    `OracleDraw` of the chunk's token-major leaves (tokens first) and its share of every gradient
    summed over tokens (the caller sums the chunks'); and its `other_results`, the same for each
    batch of `other_units` (every draw's units again, its seed kept). oracle_unit_roundoffs(case, operand_roundoff,
    backend_terms): the rounding model's units (backend_terms: primitive -> its measured
    error on the backend, past the model's).
    oracle_key(case): what else of the case an oracle answer depends on (JSON-able).
    hypotheses(case, branch, units): the `Hypothesis`es of a failing leaf of the case, for
    the model's units (`oracle_unit_roundoffs`); hypothesis_draws(case, fixture, branch,
    hypotheses): one `OracleDraw` per hypothesis, the oracle computing what it would (fitted
    ones aside); hypothesis_responses(case, fixture, branch, hypotheses): per fitted hypothesis,
    the oracle's linear response to an error at its place, `apply(p) -> OracleDraw` of the
    leaves' changes and `transpose(draw) -> p` (an `OracleDraw` of leaf cotangents).
    name_problem(name): what is wrong with `name` as one of its hypotheses' names ("" if nothing).
    EXTERNAL_HOOKS: the methods an external implementation run inside the operation's layer
    provides (`layer_builder(external=...)`).
    ORACLE_MODULES, PROGRAM_MODULES, KERNEL_MODULES: the modules (or packages) only the
    oracle, only a path's program, only the kernel paths run; the stores' keys leave each
    out of the others' code (`program_store`, `oracle_cache`, `fit_store`).
    """

    NAME: str
    FORWARD_LEAVES: tuple[str, ...]
    WEIGHT_NAMES: tuple[str, ...]
    EXTERNAL_HOOKS: tuple[str, ...]
    ORACLE_MODULES: tuple[str, ...]
    PROGRAM_MODULES: tuple[str, ...]
    KERNEL_MODULES: tuple[str, ...]

    def forward_leaf_dtypes(self, act_dtype: str) -> dict[str, str]: ...

    def forward_leaf_kind(self, leaf: str) -> str: ...

    def weight_kind(self, name: str) -> str: ...

    def layer_builder(self, *, kernel: bool, interpret: bool, external: Any = None) -> LayerBuilder: ...

    def oracle_draws(self, case, fixture, branch, draws: Sequence[tuple]) -> list[OracleDraw]: ...

    def oracle_chunks(
        self,
        case,
        fixture,
        branch,
        draws: Sequence[tuple],
        chunk_tokens: int,
        in_flight: int = 1,
        room=None,
        other_units: Sequence[Sequence] = (),
    ) -> Iterator: ...

    def oracle_unit_roundoffs(
        self, case, matmul_operand_roundoff: float, backend_terms: Mapping[str, float] | None = None
    ) -> dict[str, float]: ...

    def oracle_key(self, case) -> dict: ...

    def hypotheses(self, case, branch, units: Mapping[str, float]) -> Sequence[Hypothesis]: ...

    def hypothesis_draws(self, case, fixture, branch, hypotheses: Sequence) -> list[OracleDraw]: ...

    def hypothesis_responses(self, case, fixture, branch, hypotheses: Sequence) -> list: ...

    def name_problem(self, name: str) -> str: ...


OPERATION: Operation = mhc_operation
