"""MaxText's kernel programs lowered for TPU (Mosaic) from any machine, and compiled for the compile rows.

Pre and post forward and their VJPs, unsharded and token-sharded on an abstract TPU mesh. The released `pre`
cannot be traced under `jit`, so they enter at `mhc_kernels_fwd.pre` with constant permutations (the program
names say so): bare as released, in a token `shard_map` as fixed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from maxtext.kernels.mhc import api

from mhc_parity.cases.spec import MESH_AXES
from mhc_parity.maxtext_parity.fixes import KernelCalls, permutation_constant
from mhc_parity.mhc.kernels.lowering import LoweringResult, abstract_tpu_mesh, lower_for_tpu, weight_structs

ENTRY = "mhc_kernels_fwd"
PROGRAM_NAMES = tuple(
    f"{program} ({ENTRY})" for program in ("pre_forward", "post_forward", "pre_backward", "post_backward")
)


def kernel_programs(kernel_api, case, mesh) -> dict:
    """{program name: (fn, structs)} of a `KernelApi` for `case` on `mesh` (a Mesh or AbstractMesh over
    `MESH_AXES`), inputs token-sharded where it has several devices. Raises what tracing `pre` raises."""
    sharded = mesh.size > 1
    # Unsharded: no sharding on an abstract mesh (lowering), its one device on a concrete one.
    placed = sharded or isinstance(mesh, Mesh)
    tokens = (
        NamedSharding(mesh, PartitionSpec(*(MESH_AXES[: len(mesh.axis_names)] if sharded else ()))) if placed else None
    )
    config = kernel_api.kernel_config(case, interpret=False)
    calls = KernelCalls(
        interpret=False,
        constant_permutations=True,
        mesh=mesh if (sharded and kernel_api.fixed) else None,
        float32_permutation_mix=kernel_api.fixed,
    )
    permutations = permutation_constant(case.streams)
    act = jnp.dtype(case.dtype)
    weights = api.MhcWeights(**weight_structs(case.mhc_config(), act, tokens))
    x = jax.ShapeDtypeStruct(case.shape, act, sharding=tokens)
    layer_output = jax.ShapeDtypeStruct(case.shape[:2] + (case.embedding,), act, sharding=tokens)

    def pre(x_, weights_):
        return calls.pre(x_, weights_, permutations, config=config)

    def post(layer_output_, context):
        return calls.post(layer_output_, context, config=config)

    def pre_backward(x_, weights_, cotangent):
        _, pullback = jax.vjp(pre, x_, weights_)
        return pullback(cotangent)

    def post_backward(layer_output_, context, cotangent):
        _, pullback = jax.vjp(post, layer_output_, context)
        return pullback(cotangent)

    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh if isinstance(mesh, Mesh) else mesh):
        _, context = jax.eval_shape(pre, x, weights)
    context = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=tokens), context)
    programs = (
        (pre, (x, weights)),
        (post, (layer_output, context)),
        (pre_backward, (x, weights, (layer_output, context))),
        (post_backward, (layer_output, context, x)),
    )
    return dict(zip(PROGRAM_NAMES, programs))


def lower_programs(kernel_api, case, mesh_shape: tuple[int, ...]) -> list:
    """One `LoweringResult` per program of `kernel_api` for `case`."""
    mesh = abstract_tpu_mesh(tuple(mesh_shape), MESH_AXES[: len(mesh_shape)])
    try:
        programs = kernel_programs(kernel_api, case, mesh)
    except Exception as exc:  # noqa: BLE001 - nothing to lower: every program's row says why
        return [LoweringResult(name, False, f"{type(exc).__name__}: {exc}") for name in PROGRAM_NAMES]
    return [lower_for_tpu(name, fn, structs, mesh) for name, (fn, structs) in programs.items()]
