"""The float64 oracle with deterministic roundings at named sites: what a precision bug computes.

A precision bug is a rounding at the wrong place: a gate bias held in bfloat16, a cotangent
stored before its reduction, an intermediate kept in the activation dtype where a correct
path keeps float32. Each `Rounding` names one rounding site of the oracle's model
(`mhc.oracle.ROUNDING_SITES`, and a branch's own sites), a direction (the value, or the
cotangent flowing back through it) and a dtype; the program rounds exactly there, to
nearest, and holds every other value in float64. Its error against the exact oracle is the
bug's error, value for value, with none of a real path's legitimate rounding on top.

`run_oracle_roundings` runs any number of such hypotheses (each a set of roundings) in one
compiled program: the roundings are data (a code per site call and direction), so every
hypothesis list of a shape, branch and config shares it (padded to one batch size). Written
on `mhc.oracle`'s math (`_layer_and_vjp`), so it computes the same function; like that
module it imports nothing that computes from `mhc`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mhc import oracle

# XLA:CPU's first optimisation level: the hypotheses' program compiles in about half the default
# level's time and runs nearly as fast (the sensitivity draws' level 0 runs it several times slower).
_COMPILER_OPTIONS = {"xla_backend_optimization_level": 1}
# The batch a hypotheses program runs (more hypotheses: the next power of two): above the count
# of a float32 case's (every site twice, the gates per gate), so bfloat16 and float32 cases share it.
PADDED_HYPOTHESES = 64
# The dtypes a hypothesis may round to; a rounding's code is its index here plus one (0: exact).
ROUNDING_DTYPES = ("bfloat16", "float16", "float32")
DIRECTIONS = ("forward", "backward")


@dataclasses.dataclass(frozen=True)
class Rounding:
    """One deterministic round-to-nearest in the oracle.

    site: a rounding site (`mhc.oracle.ROUNDING_SITES` or the branch's own); direction:
    "forward" (the value) or "backward" (the cotangent flowing back through it); dtype: one
    of `ROUNDING_DTYPES`; parts: only the site's values with these names (the weights of
    "gate_weight", "matmul_weight" and "branch_param" are named by their field), () all.
    """

    site: str
    direction: str
    dtype: str
    parts: tuple[str, ...] = ()

    def __post_init__(self):
        if self.direction not in DIRECTIONS:
            raise ValueError(f"rounding direction {self.direction!r} is not one of {DIRECTIONS}")
        if self.dtype not in ROUNDING_DTYPES:
            raise ValueError(f"rounding dtype {self.dtype!r} is not one of {ROUNDING_DTYPES}")


def _rounded(v, code, dtypes: tuple[str, ...]):
    """v rounded to nearest in the dtype `code` names (0: v itself); code is traced, and
    only the `dtypes` some hypothesis of the batch uses are computed."""
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


class _CodedRounding:
    """At the i-th site call, the value rounds by codes[i, 0] and its cotangent by codes[i, 1]."""

    def __init__(self, sites: Sequence[tuple[str, tuple[int, ...]]], codes, dtypes: tuple[str, ...]):
        self.sites, self.codes, self.dtypes, self.calls = list(sites), codes, dtypes, 0

    def __call__(self, v, site: str, part: str = ""):
        del part
        if self.calls >= len(self.sites) or self.sites[self.calls] != (site, tuple(v.shape)):
            raise AssertionError(f"rounding site {self.calls} is {(site, v.shape)}, the recording pass differs")
        index = self.calls
        self.calls += 1
        codes = self.codes[index].astype(v.dtype)
        return _round_coded(v, codes[0], codes[1], self.dtypes)


def _recorded_calls(x, w, p, ct, config, branch_apply, branch_sites) -> list[tuple[str, tuple[int, ...], str]]:
    """(site, shape, part) of every site call of one draw, in call order (an abstract trace)."""
    recorder = oracle._recorded(x, w, p, ct, config, branch_apply, branch_sites)
    return [(site, shape, part) for (site, shape), part in zip(recorder.sites, recorder.parts)]


def rounding_codes(
    calls: Sequence[tuple[str, tuple[int, ...], str]], hypotheses: Sequence[Sequence[Rounding]], known_sites
) -> np.ndarray:
    """(H, calls, 2) float64 codes: per hypothesis, site call and direction, the dtype to round to.

    A rounding naming a site outside `known_sites`, or parts its site never has, is an error.
    """
    parts_of: dict[str, set[str]] = {}
    for site, _, part in calls:
        parts_of.setdefault(site, set()).add(part)
    codes = np.zeros((len(hypotheses), len(calls), 2))
    for h, roundings in enumerate(hypotheses):
        for rounding in roundings:
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
def _roundings_program(branch_apply, config, branch_sites: oracle.BranchSites, dtypes: tuple[str, ...]):
    """The jitted float64 forward + VJP of a batch of hypotheses: program(x, w, p, ct, codes)
    with codes (H, calls, 2) (`rounding_codes`) naming only `dtypes`; every output gains a
    leading H axis. Compiled at `_COMPILER_OPTIONS`' level: it runs one forward + VJP per
    hypothesis, so execution matters here as much as compilation (bench/causes_bench.py)."""

    def one_hypothesis(x, w, p, ct, codes):
        calls = _recorded_calls(x, w, p, ct, config, branch_apply, branch_sites)
        rounding = _CodedRounding([(site, shape) for site, shape, _ in calls], codes, dtypes)
        forward, d_x, d_layer_output, d_w, d_p = oracle._layer_and_vjp(
            x, w, p, ct, rounding, config, branch_apply, branch_sites
        )
        if rounding.calls != len(calls):
            raise AssertionError(f"{rounding.calls} rounding sites traced, the recording pass saw {len(calls)}")
        # The inputs round before the differentiated function, so the cotangent reaching one,
        # its gradient, is rounded here: a stored d_x or weight gradient.
        gradients = {"x": {"": d_x}, "gate_weight": d_w, "matmul_weight": d_w, "branch_param": d_p}
        for index, (site, _, part) in enumerate(calls):
            if site in gradients and part in gradients[site]:
                gradients[site][part] = _rounded(gradients[site][part], codes[index, 1], dtypes)
        return forward, gradients["x"][""], d_layer_output, d_w, d_p

    return jax.jit(jax.vmap(one_hypothesis, in_axes=(None, None, None, None, 0)), compiler_options=_COMPILER_OPTIONS)


def run_oracle_roundings(
    x,
    weights,
    branch_apply: oracle.BranchApply,
    branch_params: Mapping[str, Any],
    cotangent,
    config,
    *,
    hypotheses: Sequence[Sequence[Rounding]],
    branch_sites: Mapping[str, oracle.RoundingSite] | None = None,
) -> list[oracle.OracleResult]:
    """The oracle once per hypothesis, each rounding exactly where its `Rounding`s say.

    Arguments as for `mhc.oracle.run_oracle`; hypotheses: one sequence of `Rounding`s per
    result (an empty one: the exact oracle). Returns one `OracleResult` per hypothesis, in
    order, NumPy float64, from one compiled program (per shape, branch and config).
    """
    if not hypotheses:
        raise ValueError("run_oracle_roundings needs at least one hypothesis")
    sites = oracle._branch_site_tuple(branch_sites)
    known = set(oracle.ROUNDING_SITES) | {name for name, _ in sites}
    with jax.enable_x64(True), jax.default_device(oracle.oracle_device()):
        x64, w64, p64, ct64 = oracle._float64_inputs(x, weights, branch_params, cotangent)
        calls = _recorded_calls(x64, w64, p64, ct64, config, branch_apply, sites)
        codes = rounding_codes(calls, hypotheses, known)
        # Padded with exact rows to `PADDED_HYPOTHESES` (or the next power of two): cases of one
        # shape, branch and config share the program whatever their dtypes' hypothesis count.
        padded = np.zeros((max(PADDED_HYPOTHESES, 1 << (len(hypotheses) - 1).bit_length()), *codes.shape[1:]))
        padded[: len(hypotheses)] = codes
        codes = jnp.asarray(padded)
        dtypes = tuple(sorted({r.dtype for roundings in hypotheses for r in roundings}))
        program = _roundings_program(branch_apply, config, sites, dtypes)
        outputs = jax.tree.map(lambda a: np.asarray(a, dtype=np.float64), program(x64, w64, p64, ct64, codes))
    return [oracle._result(jax.tree.map(lambda a, i=i: a[i], outputs)) for i in range(len(hypotheses))]
