"""An external implementation with a primitive of its own, lowered through `mlir.lower_fun` of a
function that reads a tuning table and an environment variable while it lowers (issue 66, 2):
the traced jaxpr is the same whatever the table says; the lowered module is not.

Importing it registers the lowering (`register`), as such a library does at import.
"""

from __future__ import annotations

import dataclasses
import os

from jax.extend.core import Primitive
from jax.interpreters import ad, mlir

from tests.external_impls import WrappedReference

# The tuning table the lowering reads, and the environment variable that scales it further.
TABLE = {"gain": 1.0}
GAIN_VARIABLE = "TUNED_LOWERING_GAIN"

tuned_scale_p = Primitive("tuned_scale")


def _tuned_scale(x):
    """x times the table's gain: read when the primitive is lowered, not when it is traced."""
    return x * (TABLE["gain"] * float(os.environ.get(GAIN_VARIABLE, "1")))


def register() -> None:
    """Register the primitive's rules (again, after a test took its lowering away)."""
    tuned_scale_p.def_impl(_tuned_scale)
    tuned_scale_p.def_abstract_eval(lambda x: x)
    ad.deflinear2(tuned_scale_p, lambda cotangent, x: [tuned_scale_p.bind(cotangent)])
    mlir.register_lowering(tuned_scale_p, mlir.lower_fun(_tuned_scale, multiple_results=False))


register()


@dataclasses.dataclass(frozen=True)
class TunedOutput(WrappedReference):
    """The reference with `out` passed through `tuned_scale` (the reference's at gain 1.0)."""

    name: str = "tuned_output"

    def post(self, layer_output, context, *, config):
        return tuned_scale_p.bind(super().post(layer_output, context, config=config))


def tuned_output():
    return TunedOutput()
