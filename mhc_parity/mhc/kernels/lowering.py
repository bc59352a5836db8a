"""Lower the four mHC kernel programs (pre/post forward and backward) for TPU from a CPU,
under an abstract TPU mesh; one `LoweringResult` per program, never raising. Catches Mosaic's
block rule, primitives without a Mosaic lowering and a kernel called bare on sharded inputs;
not VMEM overflow or layout problems, which only Mosaic's compiler sees (docs/jax-notes.md).
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
from jax.sharding import AbstractDevice, AbstractMesh, AxisType, NamedSharding, PartitionSpec

from mhc_parity.mhc.kernels import api
from mhc_parity.mhc.kernels.config import KernelConfig
from mhc_parity.mhc.sharding import DEFAULT_TOKEN_AXES
from mhc_parity.mhc.types import MATMUL_FIELDS, MhcConfig, MhcContext, MhcWeights

TPU_DEVICE_KIND = "TPU7x"
PROGRAMS = ("pre_forward", "post_forward", "pre_backward", "post_backward")


@dataclasses.dataclass(frozen=True)
class LoweringResult:
    """Outcome of lowering one program: `ok`, else `error` = "ExceptionType: message"."""

    program: str
    ok: bool
    error: str = ""
    seconds: float = 0.0


def abstract_tpu_mesh(mesh_shape: tuple[int, ...] = (), axis_names: tuple[str, ...] = ()) -> AbstractMesh:
    """An AbstractMesh of TPU devices (() -> one device). Axes are `Auto`, as a training mesh's:
    under `AbstractMesh`'s default `Explicit` a sharding-in-types check stops before any kernel lowers."""
    size = 1
    for s in mesh_shape:
        size *= s
    return AbstractMesh(
        tuple(mesh_shape),
        tuple(axis_names),
        axis_types=(AxisType.Auto,) * len(mesh_shape),
        abstract_device=AbstractDevice(TPU_DEVICE_KIND, size, "tpu"),
    )


def lower_for_tpu(program: str, fn, structs, mesh: AbstractMesh) -> LoweringResult:
    """Lower `jax.jit(fn)` at `structs` for TPU under `mesh`; never raises. ok only if the
    module contains a `tpu_custom_call` (a program that lost its kernels is no success)."""
    start = time.perf_counter()
    try:
        with jax.sharding.use_abstract_mesh(mesh):
            lowered = jax.jit(fn).trace(*structs).lower(lowering_platforms=("tpu",))
            text = lowered.as_text()
        if "tpu_custom_call" not in text:
            return LoweringResult(
                program, False, "no tpu_custom_call in the lowered module", time.perf_counter() - start
            )
        return LoweringResult(program, True, "", time.perf_counter() - start)
    except Exception as err:  # noqa: BLE001 - every failure becomes a row
        message = f"{type(err).__name__}: {err}"
        return LoweringResult(program, False, message, time.perf_counter() - start)


def weight_structs(config: MhcConfig, dtype, sharding=None) -> dict[str, jax.ShapeDtypeStruct]:
    """Weight structs by field name: matmul leaves in `dtype`, gate leaves float32; replicated
    on `sharding`'s mesh where given."""
    replicated = None if sharding is None else NamedSharding(sharding.mesh, PartitionSpec())
    return {
        name: jax.ShapeDtypeStruct(shape, dtype if name in MATMUL_FIELDS else jnp.float32, sharding=replicated)
        for name, shape in config.dims.weight_shapes().items()
    }


def _structs(config: MhcConfig, batch: int, seq: int, dtype, sharding):
    n, c = config.streams, config.embedding
    tok = lambda *shape, dt=dtype: jax.ShapeDtypeStruct(shape, dt, sharding=sharding)
    weights = MhcWeights(**weight_structs(config, dtype, sharding))
    x = tok(batch, seq, n, c)
    y = tok(batch, seq, c)
    context = MhcContext(
        x=x,
        h_pre=tok(batch, seq, n, dt=jnp.float32),
        h_post=tok(batch, seq, n, dt=jnp.float32),
        h_res=tok(batch, seq, n, n, dt=jnp.float32),
    )
    return x, weights, y, context


def kernel_programs(
    config: MhcConfig,
    *,
    batch: int,
    seq: int,
    dtype,
    kernel: KernelConfig,
    mesh: AbstractMesh | None = None,
    bare: bool = False,
):
    """{program name: (fn, structs)} for the four kernel programs, Mosaic mode; inputs sharded
    on P("data", "fsdp") over `mesh`. bare: the per-shard kernels called without shard_map."""
    kernel = dataclasses.replace(kernel, interpret=False)
    sharding = None
    if mesh is not None:
        axes = tuple(a if a in mesh.axis_names else None for a in DEFAULT_TOKEN_AXES)
        sharding = NamedSharding(mesh, PartitionSpec(*axes))
    x, weights, y, context = _structs(config, batch, seq, dtype, sharding)
    if bare:

        def pre_fn(x, w):
            return api._pre_local(config, kernel, x, jax.tree.map(lambda a: a.astype(jnp.float32), w))

        def post_fn(y, ctx):
            return api._post_local(config, kernel, y, ctx)
    else:
        pre_fn = functools.partial(_pre, config=config, kernel=kernel, mesh=mesh)
        post_fn = functools.partial(_post, config=config, kernel=kernel, mesh=mesh)

    def pre_bwd(x, w, d_li, d_ctx):
        _, vjp = jax.vjp(pre_fn, x, w)
        return vjp((d_li, d_ctx))

    def post_bwd(y, ctx, g):
        _, vjp = jax.vjp(post_fn, y, ctx)
        return vjp(g)

    return {
        "pre_forward": (pre_fn, (x, weights)),
        "post_forward": (post_fn, (y, context)),
        "pre_backward": (pre_bwd, (x, weights, y, context)),
        "post_backward": (post_bwd, (y, context, x)),
    }


def _pre(x, w, *, config, kernel, mesh):
    return api.pre(x, w, config=config, kernel=kernel, mesh=mesh)


def _post(y, ctx, *, config, kernel, mesh):
    return api.post(y, ctx, config=config, kernel=kernel, mesh=mesh)


def lower_kernel_programs(
    config: MhcConfig,
    *,
    batch: int,
    seq: int,
    dtype=jnp.float32,
    kernel: KernelConfig = KernelConfig(),
    mesh_shape: tuple[int, ...] = (),
    axis_names: tuple[str, ...] = DEFAULT_TOKEN_AXES,
    bare: bool = False,
    programs: tuple[str, ...] = PROGRAMS,
) -> list[LoweringResult]:
    """Lower the kernel programs for TPU; one LoweringResult per program, failed ones included
    (also where building raises). mesh_shape: () for one device, else e.g. (2, 4) over `axis_names`."""
    names = axis_names[: len(mesh_shape)] if mesh_shape else ()
    mesh = abstract_tpu_mesh(tuple(mesh_shape), tuple(names))
    results = []
    try:
        built = kernel_programs(
            config, batch=batch, seq=seq, dtype=dtype, kernel=kernel, mesh=mesh if mesh_shape else None, bare=bare
        )
    except Exception as err:  # noqa: BLE001
        return [LoweringResult(p, False, f"{type(err).__name__}: {err}") for p in programs]
    for name in programs:
        fn, structs = built[name]
        results.append(lower_for_tpu(name, fn, structs, mesh))
    return results
