"""The float64 oracle with deterministic roundings: what a precision bug computes.

A `Rounding` rounds one site's value or cotangent to nearest in a dtype, every other value
float64: its error is the bug's, value for value. An `Accumulation` sums one contraction in a
narrow dtype; its error depends on the backend's order, so it reproduces the size, not the
values. `run_oracle_roundings` runs many such hypotheses as data in two compiled programs (with
and without narrow sums), on `oracle_math`'s function.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mhc_parity.mhc import oracle, oracle_math, rounding_model

# Rows of each hypotheses program (more: the next power of two), above a float32 case's counts,
# so bfloat16 and float32 cases share each program.
PADDED_HYPOTHESES = 64
PADDED_SUMS = 32
# The dtypes a hypothesis may round to; a rounding's code is its index here plus one (0: exact).
ROUNDING_DTYPES = ("bfloat16", "float16", "float32")
DIRECTIONS = ("forward", "backward", "recomputed")
# A kernel may load weights narrow in its forward while its backward recomputes from unrounded ones.
RECOMPUTED_SITES = ("gate_weight", "matmul_weight")
OUTPUTS = ("value", "first_cotangent", "second_cotangent")
# `Accumulation.block` for XLA's own narrow reduction, in the host CPU's order (an accelerator
# path sums in its own: `Hypothesis.backend_sum_weights`).
BACKEND_ORDER = 0


@dataclasses.dataclass(frozen=True)
class Rounding:
    """One deterministic round-to-nearest at `site` (the layer's or the branch's). direction:
    "forward" (the value), "backward" (its cotangent) or "recomputed" (a weight in the forward
    only, the pre's VJP exact). parts: only the site's values with these names (weights by
    field), () all.
    """

    site: str
    direction: str
    dtype: str
    parts: tuple[str, ...] = ()

    def __post_init__(self):
        if self.direction not in DIRECTIONS:
            raise ValueError(f"rounding direction {self.direction!r} is not one of {DIRECTIONS}")
        if self.direction == "recomputed" and self.site not in RECOMPUTED_SITES:
            raise ValueError(f"a recomputed rounding names a weight site ({RECOMPUTED_SITES}), not {self.site!r}")
        if self.dtype not in ROUNDING_DTYPES:
            raise ValueError(f"rounding dtype {self.dtype!r} is not one of {ROUNDING_DTYPES}")


@dataclasses.dataclass(frozen=True)
class Accumulation:
    """One contraction's `output` summed with a running sum in `dtype`. block: terms summed
    exactly before each addition (1: term by term; more: a tile's partial sum; `BACKEND_ORDER`:
    XLA's narrow reduction). parts: only those calls (a gate's name), () all.
    """

    contraction: str
    output: str
    dtype: str
    block: int = 1
    parts: tuple[str, ...] = ()

    def __post_init__(self):
        if self.contraction not in rounding_model.CONTRACTIONS:
            raise ValueError(f"{self.contraction!r} is not a contraction of mhc_parity.mhc.rounding_model.CONTRACTIONS")
        if self.output not in OUTPUTS:
            raise ValueError(f"accumulation output {self.output!r} is not one of {OUTPUTS}")
        if self.dtype not in ROUNDING_DTYPES:
            raise ValueError(f"accumulation dtype {self.dtype!r} is not one of {ROUNDING_DTYPES}")
        if not (isinstance(self.block, int) and self.block >= BACKEND_ORDER):
            raise ValueError(f"accumulation block {self.block!r} is not a positive int or BACKEND_ORDER")


def output_spec(spec: str, output: str) -> str:
    """The einsum of `output` of `spec`: itself, or the cotangent with the other operand."""
    inputs, result = spec.split("->")
    first, second = inputs.split(",")
    return {
        "value": spec,
        "first_cotangent": f"{result},{second}->{first}",
        "second_cotangent": f"{result},{first}->{second}",
    }[output]


def summed_letters(spec: str) -> str:
    inputs, result = spec.split("->")
    first, second = inputs.split(",")
    return "".join(c for c in first if c in second and c not in result)


def _narrow_sum(spec: str, a, b, dtype: str, block: int):
    """einsum(spec, a, b) summed `block` terms at a time, the running sum rounded to `dtype`
    after each addition (a spec that sums nothing: its products rounded once)."""
    summed = summed_letters(spec)
    if not summed:
        return jnp.einsum(spec, a, b, precision=jax.lax.Precision.HIGHEST).astype(dtype).astype(a.dtype)
    inputs, result = spec.split("->")
    letters = inputs.split(",")
    if block == BACKEND_ORDER:
        every = "".join(dict.fromkeys(letters[0] + letters[1]))
        terms = jnp.einsum(f"{inputs}->{every}", a, b, precision=jax.lax.Precision.HIGHEST).astype(dtype)
        total = jnp.sum(terms, axis=tuple(every.index(c) for c in summed), dtype=dtype)
        kept = "".join(c for c in every if c not in summed)
        return jnp.einsum(f"{kept}->{result}", total.astype(a.dtype))

    def summed_first(v, names):
        order = [names.index(c) for c in summed] + [i for i, c in enumerate(names) if c not in summed]
        v = jnp.transpose(v, order)
        v = v.reshape(-1, *v.shape[len(summed) :])
        pad = -v.shape[0] % block
        v = jnp.pad(v, [(0, pad)] + [(0, 0)] * (v.ndim - 1))
        return v.reshape(-1, block, *v.shape[1:])

    term = next(c for c in "zyxwvutsrq" if c not in spec)
    step_spec = ",".join(term + "".join(c for c in names if c not in summed) for names in letters) + "->" + result
    blocks = (summed_first(a, letters[0]), summed_first(b, letters[1]))

    def add_block(total, pair):
        partial = jnp.einsum(step_spec, *pair, precision=jax.lax.Precision.HIGHEST)
        return (total + partial).astype(dtype).astype(total.dtype), None

    start = jnp.zeros(jax.eval_shape(lambda p: jnp.einsum(step_spec, *p), (blocks[0][0], blocks[1][0])).shape, a.dtype)
    total, _ = jax.lax.scan(add_block, start, blocks)
    return total


# Per contraction and output, the (dtype, block) sums some hypothesis asks for.
SumOptions = tuple[tuple[str, tuple[tuple[tuple[str, int], ...], ...]], ...]


def _coded_sum(spec: str, code, a, b, options: tuple[tuple[str, int], ...]):
    """einsum(spec, a, b) exactly (code 0) or as `_narrow_sum` at options[code - 1] (traced)."""
    exact = lambda a_, b_: jnp.einsum(spec, a_, b_, precision=jax.lax.Precision.HIGHEST)  # noqa: E731
    branches = [exact] + [functools.partial(_narrow_sum, spec, dtype=d, block=k) for d, k in options]
    return jax.lax.switch(code, branches, a, b)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 4))
def _coded_contraction(spec, a, b, codes, options):
    """einsum(spec, a, b) whose value and operand cotangents sum as codes (3,) int32 say."""
    return _coded_sum(spec, codes[0], a, b, options[0])


def _coded_contraction_fwd(spec, a, b, codes, options):
    return _coded_sum(spec, codes[0], a, b, options[0]), (a, b, codes)


def _coded_contraction_bwd(spec, options, residuals, g):
    a, b, codes = residuals
    d_a = _coded_sum(output_spec(spec, "first_cotangent"), codes[1], g, b, options[1])
    d_b = _coded_sum(output_spec(spec, "second_cotangent"), codes[2], g, a, options[2])
    return d_a, d_b, np.zeros(codes.shape, jax.dtypes.float0)


_coded_contraction.defvjp(_coded_contraction_fwd, _coded_contraction_bwd)


def _rounded(v, code, dtypes: tuple[str, ...]):
    """v rounded to nearest in the dtype traced `code` names (0: v itself), among `dtypes`."""
    out = v
    for name in dtypes:
        out = jnp.where(code == ROUNDING_DTYPES.index(name) + 1, v.astype(name).astype(v.dtype), out)
    return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _round_coded(v, forward_code, backward_code, dtypes):
    return _rounded(v, forward_code, dtypes)


def _round_coded_fwd(v, forward_code, backward_code, dtypes):
    return _rounded(v, forward_code, dtypes), (forward_code, backward_code)


def _round_coded_bwd(dtypes, residuals, g):
    forward_code, backward_code = residuals
    return _rounded(g, backward_code, dtypes), jnp.zeros_like(forward_code), jnp.zeros_like(backward_code)


_round_coded.defvjp(_round_coded_fwd, _round_coded_bwd)


class _ContractionRecorder(oracle_math.SiteRecorder):
    """A `SiteRecorder` that also notes each contraction call's (name, part)."""

    def __init__(self):
        super().__init__()
        self.contractions: list[tuple[str, str]] = []  # (name, part) per call

    def contract(self, name: str, spec: str, a, b, part: str = "", exact=None):
        self.contractions.append((name, part))
        return jnp.einsum(spec, a, b)


class _CodedRounding:
    """At the i-th site call the value rounds by codes[i, 0], its cotangent by codes[i, 1]; the
    j-th contraction call sums as sums[j] says."""

    def __init__(
        self,
        sites: Sequence[tuple[str, tuple[int, ...]]],
        codes,
        dtypes: tuple[str, ...],
        sums=None,
        options: SumOptions = (),
        coded_sites: frozenset[str] | None = None,
    ):
        self.sites, self.codes, self.dtypes, self.calls = list(sites), codes, dtypes, 0
        self.sums, self.options, self.contractions = sums, options, 0
        self.coded_sites = coded_sites

    def rounds_at(self, site: str) -> bool:
        """Whether some hypothesis of the batch may round at `site` (else its calls pass as they are)."""
        return bool(self.dtypes) and (self.coded_sites is None or site in self.coded_sites)

    def contract(self, name: str, spec: str, a, b, part: str = "", exact=None):
        del part  # the codes name each call
        index = self.contractions
        self.contractions += 1
        options = dict(self.options).get(name, ((), (), ()))
        if exact is not None and not any(options):
            return exact()  # no hypothesis of the batch sums it narrowly: the oracle's own expression
        return _coded_contraction(spec, a, b, self.sums[index], options)

    def __call__(self, v, site: str, part: str = ""):
        del part
        if self.calls >= len(self.sites) or self.sites[self.calls] != (site, tuple(v.shape)):
            raise AssertionError(f"rounding site {self.calls} is {(site, v.shape)}, the recording pass differs")
        index = self.calls
        self.calls += 1
        if not self.rounds_at(site):
            return v
        codes = self.codes[index].astype(v.dtype)
        return _round_coded(v, codes[0], codes[1], self.dtypes)


def _recorded_calls(
    x, w, p, ct, config, branch_apply, branch_sites
) -> tuple[list[tuple[str, tuple[int, ...], str]], list[tuple[str, str]]]:
    """(site, shape, part) of every site call and (name, part) of every contraction call, in order."""
    recorder = oracle._recorded(x, w, p, ct, config, branch_apply, branch_sites, _ContractionRecorder())
    return [(site, shape, part) for (site, shape), part in zip(recorder.sites, recorder.parts)], recorder.contractions


def accumulation_options(hypotheses: Sequence[Sequence]) -> SumOptions:
    """The `SumOptions` the hypotheses use, sorted."""
    used: dict[str, list[set]] = {}
    for parts in hypotheses:
        for a in (p for p in parts if isinstance(p, Accumulation)):
            used.setdefault(a.contraction, [set() for _ in OUTPUTS])[OUTPUTS.index(a.output)].add((a.dtype, a.block))
    return tuple((name, tuple(tuple(sorted(s)) for s in sets)) for name, sets in sorted(used.items()))


def accumulation_codes(
    contractions: Sequence[tuple[str, str]], hypotheses: Sequence[Sequence], options: SumOptions
) -> np.ndarray:
    """(H, contraction calls, 3) int32: 0 exact, else 1 + the index in `options` of the (dtype,
    block) per hypothesis, call and output. ValueError for a contraction or part never called."""
    codes = np.zeros((len(hypotheses), len(contractions), len(OUTPUTS)), np.int32)
    parts_of: dict[str, set[str]] = {}
    for name, part in contractions:
        parts_of.setdefault(name, set()).add(part)
    for h, parts in enumerate(hypotheses):
        for accumulation in (a for a in parts if isinstance(a, Accumulation)):
            if accumulation.contraction not in parts_of:
                raise ValueError(f"a hypothesis accumulates {accumulation.contraction!r}, which the layer never calls")
            missing = set(accumulation.parts) - parts_of[accumulation.contraction]
            if missing:
                raise ValueError(f"contraction {accumulation.contraction!r} has no calls named {sorted(missing)}")
            output = OUTPUTS.index(accumulation.output)
            code = 1 + dict(options)[accumulation.contraction][output].index((accumulation.dtype, accumulation.block))
            for j, (name, part) in enumerate(contractions):
                if name == accumulation.contraction and (not accumulation.parts or part in accumulation.parts):
                    codes[h, j, output] = code
    return codes


def rounding_codes(
    calls: Sequence[tuple[str, tuple[int, ...], str]], hypotheses: Sequence[Sequence], known_sites
) -> np.ndarray:
    """(H, calls, 3) float64: per hypothesis, site call and direction, 0 or 1 + the dtype's
    index. ValueError for a site outside `known_sites` or a part it never has."""
    parts_of: dict[str, set[str]] = {}
    for site, _, part in calls:
        parts_of.setdefault(site, set()).add(part)
    codes = np.zeros((len(hypotheses), len(calls), len(DIRECTIONS)))
    for h, parts in enumerate(hypotheses):
        for rounding in (r for r in parts if isinstance(r, Rounding)):
            if rounding.site not in known_sites:
                raise ValueError(f"a hypothesis rounds at {rounding.site!r}, which is no rounding site")
            missing = set(rounding.parts) - parts_of.get(rounding.site, set())
            if missing:
                raise ValueError(f"site {rounding.site!r} has no values named {sorted(missing)}")
            code = ROUNDING_DTYPES.index(rounding.dtype) + 1
            column = DIRECTIONS.index(rounding.direction)
            for i, (site, _, part) in enumerate(calls):
                if site == rounding.site and (not rounding.parts or part in rounding.parts):
                    codes[h, i, column] = code
    return codes


@functools.lru_cache(maxsize=8)
def _roundings_program(
    branch_apply,
    config,
    branch_sites: rounding_model.BranchSites,
    dtypes: tuple[str, ...],
    options: SumOptions,
    coded_sites: frozenset[str] | None = None,
):
    """The jitted float64 forward + VJP of a batch of hypotheses: program(x, w, p, ct, codes
    (H, calls, 3), sums (H, contraction calls, 3), count) runs the first `count` rows; outputs
    gain a leading H axis (zeros past `count`). A loop, not `vmap`: a batched switch runs every
    branch, and the loop skips the padding (docs/jax-notes.md). coded_sites: None, every site."""

    def one_hypothesis(x, w, p, ct, codes, sums):
        calls, _ = _recorded_calls(x, w, p, ct, config, branch_apply, branch_sites)
        rounding = _CodedRounding(
            [(site, shape) for site, shape, _ in calls], codes, dtypes, sums, options, coded_sites
        )
        offsets = _recomputed_offsets(x, w, calls, codes, dtypes, config)
        forward, d_x, d_layer_output, d_w, d_p = oracle_math.layer_and_vjp(
            x, w, p, ct, rounding, config, branch_apply, branch_sites, offsets
        )
        if rounding.calls != len(calls):
            raise AssertionError(f"{rounding.calls} rounding sites traced, the recording pass saw {len(calls)}")
        # Inputs round outside the differentiated function: their gradients' rounding is here.
        gradients = {"x": {"": d_x}, "gate_weight": d_w, "matmul_weight": d_w, "branch_param": d_p}
        for index, (site, _, part) in enumerate(calls):
            if site in gradients and part in gradients[site] and rounding.rounds_at(site):
                gradients[site][part] = _rounded(gradients[site][part], codes[index, 1], dtypes)
        return forward, gradients["x"][""], d_layer_output, d_w, d_p

    def program(x, w, p, ct, codes, sums, count):
        shapes = jax.eval_shape(one_hypothesis, x, w, p, ct, codes[0], sums[0])
        outputs = jax.tree.map(lambda s: jnp.zeros((codes.shape[0], *s.shape), s.dtype), shapes)

        def run(h, outputs_):
            answer = one_hypothesis(x, w, p, ct, codes[h], sums[h])
            return jax.tree.map(lambda o, a: o.at[h].set(a), outputs_, answer)

        return jax.lax.fori_loop(0, count, run, outputs)

    return jax.jit(program, compiler_options=oracle.HYPOTHESIS_COMPILER_OPTIONS)


def _recomputed_offsets(x, w, calls, codes, dtypes: tuple[str, ...], config):
    """How the "recomputed" roundings of the weights move the pre's outputs, as constants (the
    pre's VJP stays exact); zeros where the column rounds nothing."""
    column = codes[:, DIRECTIONS.index("recomputed")]
    at = {part: i for i, (site, _, part) in enumerate(calls) if site in RECOMPUTED_SITES and part in w}

    def moved():
        rounded = {k: _rounded(v, column[at[k]], dtypes) if k in at else v for k, v in w.items()}
        layer_input, coeffs = oracle_math.pre(x, rounded, config)
        exact_input, exact_coeffs = oracle_math.pre(x, w, config)
        return (layer_input - exact_input, *(a - b for a, b in zip(coeffs, exact_coeffs)))

    def unmoved():
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(moved))

    return jax.lax.stop_gradient(jax.lax.cond(jnp.any(column != 0), moved, unmoved))


def _padded(codes: np.ndarray, rows: int):
    """codes padded with zero rows (exact; skipped) to `rows`, as a JAX array."""
    out = np.zeros((rows, *codes.shape[1:]), codes.dtype)
    out[: len(codes)] = codes
    return jnp.asarray(out)


def run_oracle_roundings(
    x,
    weights,
    branch_apply: oracle_math.BranchApply,
    branch_params: Mapping[str, Any],
    cotangent,
    config,
    *,
    hypotheses: Sequence[Sequence[Rounding | Accumulation]],
    branch_sites: Mapping[str, rounding_model.RoundingSite] | None = None,
) -> list[oracle.OracleResult]:
    """The oracle once per hypothesis (a sequence of `Rounding`s and `Accumulation`s; empty: the
    exact oracle), arguments as for `oracle.run_oracle`: one `OracleResult` per hypothesis."""
    if not hypotheses:
        raise ValueError("run_oracle_roundings needs at least one hypothesis")
    sites = rounding_model.branch_site_tuple(branch_sites)
    known = set(rounding_model.ROUNDING_SITES) | {name for name, _ in sites}
    summed = [i for i, parts in enumerate(hypotheses) if any(isinstance(p, Accumulation) for p in parts)]
    plain = [i for i in range(len(hypotheses)) if i not in set(summed)]
    results: dict[int, oracle.OracleResult] = {}
    with jax.enable_x64(True), jax.default_device(oracle.oracle_device()):
        x64, w64, p64, ct64 = oracle._float64_inputs(x, weights, branch_params, cotangent)
        calls, contractions = _recorded_calls(x64, w64, p64, ct64, config, branch_apply, sites)
        for indices, batch, every_site in ((plain, PADDED_HYPOTHESES, True), (summed, PADDED_SUMS, False)):
            if not indices:
                continue
            group = [hypotheses[i] for i in indices]
            options = accumulation_options(group)
            # Padded, so cases of one shape, branch and config share the program.
            rows = max(batch, 1 << (len(group) - 1).bit_length())
            codes = _padded(rounding_codes(calls, group, known), rows)
            sums = _padded(accumulation_codes(contractions, group, options), rows)
            roundings = [r for parts in group for r in parts if isinstance(r, Rounding)]
            dtypes = tuple(sorted({r.dtype for r in roundings}))
            # A code costs every hypothesis a choice: the sums' program codes only its few
            # sites; the roundings' program codes all, so both dtypes share it.
            coded = None if every_site else frozenset(r.site for r in roundings)
            program = _roundings_program(branch_apply, config, sites, dtypes, options, coded)
            outputs = program(x64, w64, p64, ct64, codes, sums, len(group))
            outputs = jax.tree.map(lambda a: np.asarray(a, dtype=np.float64), outputs)
            for row, i in enumerate(indices):
                results[i] = oracle._result(jax.tree.map(lambda a, row=row: a[row], outputs))
    return [results[i] for i in range(len(hypotheses))]
