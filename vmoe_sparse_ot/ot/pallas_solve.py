"""The router's semi-dual Adam solve as one Pallas kernel: each group's block stays on chip.

`batched_semi_dual_adam_pallas` computes the plans of `batched_semi_dual_adam`
(ot.batched, the 'fast' path) -- Adam ascent on alpha from 0, plan columns
t_j = top-k sparse projection of u_j = alpha / gamma - c_j / gamma onto the
b_j-scaled simplex, ties at the k-th value broken by the lower row index --
with one kernel program per group that loads the group's (m, n) costs once,
runs all `num_steps` steps and the final projection on them in on-chip memory
(registers / shared memory), and writes the plan once. The XLA path instead
runs each step as several kernels that read and write the whole (m, n * G)
array from device memory.

Per Adam step, inside the kernel (m, n padded to powers of two, see below):
  u = alpha / gamma - C / gamma                        (m, n), padded entries -inf
  k' = min(k, m) passes of "extract the maximum": in each column, the largest
    entry not yet taken (value by a max, position by an argmax, which takes the
    lowest row among equal values -- exactly the tie rule of 'fast'), added to
    a running sum s_r; tau = max over r <= k' of (s_r - b) / r, the simplex
    threshold of the column's top-k multiset (the prefix rule of
    `projections._threshold_from_sorted`); the taken entries are the members
  t = [u - tau]_+ on the members;  grad = a - sum_j t_j;  Adam on alpha.
No sort, no cumsum, no gather: maxima, argmaxima, sums and elementwise
operations, all of which the Triton lowering of Pallas supports. The passes
cost O(k' m n) per step, like 'fast''s small-k kernel (which also makes
about k passes); for k >= m they are m passes (k does not bind; 'fast' then
uses the plain simplex threshold of the whole column).

Tolerance against 'fast': the same iterates up to floating-point rounding
(the order of the sums, division against multiplication by a reciprocal,
the device's pow). The tests (tests/ot/test_pallas_solve.py) check plans
to 1e-5 absolute (float32, mass ~1 per token) and 1e-10 (float64), and equal
supports, on random problems, quantised costs with ties at the k-th value,
padding tokens and k >= m. As for 'fast', a column whose k-th and (k+1)-th
values agree only up to rounding may pick a different member.

Layout: each program holds its group's (m, n) block as it comes ("mn", the
default), or transposed, (n, m) ("nm"), so that the k passes reduce along the
block's contiguous axis (`block_layout`). Same plans up to rounding; which is
faster on a GPU is for `benchmarks/gpu.sh` to measure.

Padding: Triton wants power-of-two block shapes, so the wrapper pads m and n
up to powers of two (costs 0, masses 0); inside the kernel the padded rows
and columns are masked to u = -inf and t = 0 from their static positions, so
they are never taken before a real entry, carry no mass (their alpha stays 0)
and cannot change the plan whatever the costs' scale.

Backends: on a GPU the kernel lowers through Triton (`interpret=False`); on
the CPU it runs in Pallas interpret mode (`interpret=True`, the default
there), which is for tests -- much slower than 'fast'. Other backends (TPU /
Mosaic) are untested. No gradient is defined through the kernel (the router
stops it before the solve). Under several devices the kernel is a custom
call that the SPMD partitioner does not split: shard the groups with
`shard_map` around it (unmeasured).
"""
from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from vmoe_sparse_ot.ot import optim

Array = jax.Array


# 32 warps (1024 threads) gave plans up to 0.76 off 'fast''s on an H200 (JAX 0.11.2);
# 1-16 matched to 2.4e-7.
_WARPS = (1, 2, 4, 8, 16)
_LAYOUTS = ("mn", "nm")


def _next_pow2(x: int) -> int:
  return 1 << max(x - 1, 0).bit_length()


def _project(make_u, b: Array, k: int, axis: int, rebuild_u: bool) -> Array:
  """The top-k sparse projections of u's lines along `axis` onto the b-scaled simplex.

  u = make_u(): (m, n) with the lines along axis 0 (the "mn" layout), or (n, m)
  with them along axis 1 ("nm"); -inf at padded entries; b (1, n) or (n, 1), its
  size 1 along `axis`. k <= the number of real entries of a line, so every real
  line has k finite entries to take. rebuild_u: make u again for the plan after
  the passes instead of keeping it live through them (one block fewer held).
  """
  u = make_u()
  positions = lax.broadcasted_iota(jnp.int32, u.shape, axis)
  neg_inf = jnp.full_like(u, -jnp.inf)

  def take(r, carry):
    x, total, tau = carry
    v = jnp.max(x, axis=axis, keepdims=True)                           # b's shape
    at = jnp.expand_dims(lax.argmax(x, axis, jnp.int32), axis)         # lowest position of v
    x = jnp.where(positions == at, neg_inf, x)
    total = total + v
    tau = jnp.maximum(tau, (total - b) / (r + 1).astype(u.dtype))
    return x, total, tau

  zeros = jnp.zeros_like(b)
  x, _, tau = lax.fori_loop(0, min(k, u.shape[axis]), take, (u, zeros, zeros - jnp.inf))
  if rebuild_u:
    u = make_u()
  member = (x == -jnp.inf) & (u > -jnp.inf)
  # tau is -inf only in padded lines (all -inf); the where keeps their NaN out.
  return jnp.where(member, jnp.maximum(u - tau, 0), 0)


def _kernel(ct_ref, a_ref, b_ref, gamma_ref, lr_ref, plan_ref, *, m: int, n: int, k: int,
            num_steps: int, axis: int, reload_costs: bool):
  """One group; `axis` is where the m rows lie in the block: 0 ("mn": ct (M, N),
  a (M, 1), b (1, N)) or 1 ("nm": ct (N, M), a (1, M), b (N, 1))."""
  a = a_ref[...]
  b = b_ref[...]
  gamma = gamma_ref[...]                                               # (1, 1)
  lr = lr_ref[...]                                                     # (1, 1)

  def costs():
    ct = ct_ref[...]                                                   # C / gamma
    rows = lax.broadcasted_iota(jnp.int32, ct.shape, axis)
    cols = lax.broadcasted_iota(jnp.int32, ct.shape, 1 - axis)
    # +inf at the padded entries, so that u = alpha / gamma - ct is -inf there
    # (alpha is finite) and equals 'fast''s u elsewhere.
    return jnp.where((rows < m) & (cols < n), ct, jnp.inf)

  held = None if reload_costs else costs()

  def plan(alpha):
    make_u = lambda: alpha / gamma - (costs() if reload_costs else held)
    return _project(make_u, b, k, axis, rebuild_u=reload_costs)

  def step(i, carry):
    alpha, mu, nu = carry
    grad = a - jnp.sum(plan(alpha), axis=1 - axis, keepdims=True)
    return optim.adam_update(i, alpha, mu, nu, grad, lr)

  zeros = jnp.zeros_like(a)
  alpha, _, _ = lax.fori_loop(0, num_steps, step, (zeros, zeros, zeros))
  plan_ref[...] = plan(alpha).astype(plan_ref.dtype)


def batched_semi_dual_adam_pallas(C: Array, a: Array, b: Array, k: int, gamma, num_steps: int,
                                  learning_rate, *, interpret: Optional[bool] = None,
                                  num_warps: Optional[int] = None,
                                  block_layout: str = "mn",
                                  reload_costs: bool = False) -> Array:
  """Plans (G, m, n) of G sparsity-constrained semi-duals, `num_steps` Adam steps each.

  The arguments and the result are `ot.batched_semi_dual_adam`'s (C (G, m, n),
  a (G, m), b (G, n), static k >= 1 and num_steps >= 0, gamma and
  learning_rate scalars, may be traced); the plans equal its plans up to
  rounding (module docstring). One kernel program per group.

  interpret: run the kernel in Pallas interpret mode; None: on the CPU backend
    only (there it is for tests: slow). num_warps: Triton warps per program, 1,
    2, 4, 8 or 16 (None: 4, the fastest measured on an H200 at the B/32
    routing shapes; 32 warps gave wrong plans there, so it is refused --
    benchmarks/RESULTS.md, 2026-11-28).
  block_layout: how a program holds its group: "mn" (the default), the (m, n)
    costs as they come, so the k passes reduce along the block's first axis; or
    "nm", the transpose (n, m), so they reduce along its last (contiguous) axis,
    and only the gradient's row sums cross the first. The same arithmetic: the
    selections are exact either way, and the plans agree up to the rounding of
    those row sums (the tests check both layouts against 'fast'). Which is
    faster is the GPU's to say (Triton lays the block over the warps by its
    shape); "nm" is unmeasured there.
  reload_costs: False (the default) loads the group's costs once and holds
    them on chip for all the steps; True reads them again from device memory
    (through the caches) wherever a step needs u, so the passes hold one block
    (the entries not yet taken) instead of three. The same arithmetic, the
    same plans; fewer registers against more loads, unmeasured on a GPU.
  """
  if block_layout not in _LAYOUTS:
    raise ValueError(f"block_layout must be one of {_LAYOUTS}, got {block_layout!r}")
  if k < 1:
    raise ValueError(f"k must be >= 1, got {k}")
  if num_warps is not None and num_warps not in _WARPS:
    raise ValueError(f"num_warps must be one of {_WARPS}, got {num_warps}")
  g, m, n = C.shape
  if interpret is None:
    interpret = jax.default_backend() == "cpu"
  mp, np_ = _next_pow2(m), _next_pow2(n)
  dtype = C.dtype
  C, a, b = (lax.stop_gradient(x) for x in (C, a, b))
  gamma = jnp.asarray(gamma, dtype).reshape(1, 1)
  lr = jnp.asarray(learning_rate, dtype).reshape(1, 1)
  # C / gamma as 'fast' forms it (same rounding); padded entries are masked inside.
  ct = jnp.pad(C / gamma, ((0, 0), (0, mp - m), (0, np_ - n)))
  a_col = jnp.pad(a.astype(dtype), ((0, 0), (0, mp - m)))[:, :, None]    # (G, M, 1)
  b_row = jnp.pad(b.astype(dtype), ((0, 0), (0, np_ - n)))[:, None, :]   # (G, 1, N)
  axis = _LAYOUTS.index(block_layout)
  if axis == 1:
    ct, a_col, b_row = (jnp.swapaxes(x, 1, 2) for x in (ct, a_col, b_row))
  block, a_block, b_block = ct.shape[1:], a_col.shape[1:], b_row.shape[1:]
  kernel = functools.partial(_kernel, m=m, n=n, k=min(k, m), num_steps=num_steps, axis=axis,
                             reload_costs=reload_costs)
  compiler_params = None
  if not interpret:
    warps = num_warps or 4
    compiler_params = plgpu.CompilerParams(num_warps=warps, num_stages=1)
  plan = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((g, *block), dtype),
      grid=(g,),
      in_specs=[
          pl.BlockSpec((None, *block), lambda i: (i, 0, 0)),
          pl.BlockSpec((None, *a_block), lambda i: (i, 0, 0)),
          pl.BlockSpec((None, *b_block), lambda i: (i, 0, 0)),
          pl.BlockSpec((1, 1), lambda i: (0, 0)),
          pl.BlockSpec((1, 1), lambda i: (0, 0)),
      ],
      out_specs=pl.BlockSpec((None, *block), lambda i: (i, 0, 0)),
      interpret=interpret,
      compiler_params=compiler_params,
      name="sparse_ot_semi_dual_adam",
  )(ct, a_col, b_row, gamma, lr)
  if axis == 1:
    plan = jnp.swapaxes(plan, 1, 2)
  return plan[:, :m, :n]
