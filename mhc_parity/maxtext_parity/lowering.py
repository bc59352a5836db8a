"""MaxText's kernel programs lowered for TPU (Mosaic) from any machine.

Four programs, as `mhc_parity.mhc.kernels.lowering` builds for this project's kernels: pre forward,
post forward, and the VJP of each, at the case's shapes, unsharded and token-sharded on an
abstract TPU mesh of the case's mesh shape (`Auto` axes, as a training mesh has). The
released API's `pre` cannot be traced under `jit` (the tracer error its rows show), so
these programs enter one level below it, at `mhc_kernels_fwd.pre` with a constant
permutation array (the program names say so): as released the calls are bare, as fixed
they run in a token `shard_map` (`mhc_parity.maxtext_parity.fixes.KernelCalls`). The same
programs (`kernel_programs`) are compiled on a mesh of compile-only TPU devices for the
compile rows (`mhc_parity.harness.engine.compile_rows`).
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
    """{program name: (fn, structs)} of `kernel_api` (a `KernelApi`) for `case` on `mesh`, a
    `jax.sharding.Mesh` or `AbstractMesh` over `MESH_AXES`: its inputs are token-sharded where
    the mesh has more than one device (as released the calls are bare there, as fixed in a
    token `shard_map`), else on its one device. Raises what tracing `pre` raises."""
    sharded = mesh.size > 1
    # Unsharded on an abstract mesh (lowering): no sharding, as before; on a concrete one
    # (compiling): placed on its one device.
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
    """One `mhc_parity.mhc.kernels.lowering.LoweringResult` per program of `kernel_api` (a `KernelApi`) for `case`."""
    mesh = abstract_tpu_mesh(tuple(mesh_shape), MESH_AXES[: len(mesh_shape)])
    try:
        programs = kernel_programs(kernel_api, case, mesh)
    except Exception as exc:  # noqa: BLE001 - nothing to lower: every program's row says why
        return [LoweringResult(name, False, f"{type(exc).__name__}: {exc}") for name in PROGRAM_NAMES]
    return [lower_for_tpu(name, fn, structs, mesh) for name, (fn, structs) in programs.items()]
