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

Selection: `selection="incremental"` replaces each step's k' passes by
|count - k'| (the first step makes k'): from the previous step's k-th entry, add
or drop entries until k' remain, then Michelot's rule for tau
(`_project_incremental`).

Padding: Triton wants power-of-two block shapes, so the wrapper pads m and n
up to powers of two (costs 0, masses 0); inside the kernel the padded rows
and columns are masked to u = -inf and t = 0 from their static positions, so
they are never taken before a real entry, carry no mass (their alpha stays 0)
and cannot change the plan whatever the costs' scale.

Backends: on a GPU the kernel lowers through Triton (`interpret=False`); on
the CPU it runs in Pallas interpret mode (`interpret=True`, the default
there), which is for tests -- much slower than 'fast'. Other backends (TPU /
Mosaic) are untested. No gradient is defined through the kernel (the router
stops it before the solve). On a mesh of several devices the kernel is one
custom call, which XLA's SPMD partitioner does not split: it gathers every
group onto every device and solves them all there. Call it inside
`jax.shard_map` over the groups' axis instead, as the sparse_ot router does
(`nn.sharding.per_shard`; checked on 8 CPU devices, unmeasured on GPUs).
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
from vmoe_sparse_ot.ot import precision
from vmoe_sparse_ot.ot import validation

Array = jax.Array


# 32 warps (1024 threads) gave plans up to 0.76 off 'fast''s on an H200 (JAX 0.11.2);
# 1-16 matched to 2.4e-7.
_WARPS = (1, 2, 4, 8, 16)
_LAYOUTS = ("mn", "nm")
_SELECTIONS = ("passes", "incremental")


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


def _project_incremental(u: Array, b: Array, k: int, axis: int, real_line: Array,
                         pivot: tuple[Array, Array]) -> tuple[Array, tuple[Array, Array]]:
  """`_project`'s plan, its member set reached from the previous step's k-th entry.

  u: (m, n) or (n, m) as in `_project` (already made; -inf at padded entries);
  real_line: b's shape, False at padded lines. pivot: (value, position) of each
  line's k-th member at the previous step ((+inf, -1) before the first: no member).
  Entries rank by value, then by the lower position (the tie rule of 'fast'), so
  the entries at or above the pivot are the top of the line, and adding the best
  entry outside or dropping the worst inside keeps them so: |count - k| passes,
  in lockstep over the block (a while loop; the first step makes k, as `_project`).
  The threshold: Michelot's rule on the members (tau = (sum - b) / count, drop the
  members at or below it, again until none drops); all k members keep mass
  in most steps, so one round of two sums usually settles it. The same plan as the
  prefix rule up to the rounding of the sums. Returns (plan, the new pivot).
  """
  positions = lax.broadcasted_iota(jnp.int32, u.shape, axis)
  neg_inf = jnp.full_like(u, -jnp.inf)
  finite = u > neg_inf
  value, at = pivot
  member = ((u > value) | ((u == value) & (positions <= at))) & finite
  excess = jnp.where(real_line, jnp.sum(member.astype(jnp.int32), axis, keepdims=True) - k, 0)

  def unsettled(carry):
    return jnp.max(jnp.abs(carry[1])) > 0

  def adjust(carry):
    member, excess = carry
    drop, add = excess > 0, excess < 0
    # Dropping: the worst member (lowest value, then highest position); adding: the
    # best entry outside (highest value, then lowest position). One max each.
    score = jnp.where(drop, jnp.where(member, -u, neg_inf),
                      jnp.where(add & ~member & finite, u, neg_inf))
    best = jnp.max(score, axis=axis, keepdims=True)
    key = jnp.where(drop, positions, -positions)
    chosen = jnp.max(jnp.where(score == best, key, -jnp.iinfo(jnp.int32).max), axis=axis,
                     keepdims=True)
    member = member ^ ((key == chosen) & (excess != 0))
    return member, excess - jnp.where(drop, 1, jnp.where(add, -1, 0))

  member, _ = lax.while_loop(unsettled, adjust, (member, excess))
  inf = jnp.full_like(u, jnp.inf)
  low = jnp.min(jnp.where(member, u, inf), axis=axis, keepdims=True)
  low_at = jnp.max(jnp.where(member & (u == low), positions, -1), axis=axis, keepdims=True)

  def dropping(carry):
    return carry[2]

  def michelot(carry):
    support, _, _ = carry
    total = jnp.sum(jnp.where(support, u, 0), axis=axis, keepdims=True)
    count = jnp.sum(support.astype(u.dtype), axis=axis, keepdims=True)
    tau = (total - b) / count                # NaN in padded lines (no member), masked below
    kept = support & (u > tau)
    kept_count = jnp.sum(kept.astype(u.dtype), axis=axis, keepdims=True)
    # An empty set (b = 0: every entry at the threshold) keeps the last support.
    kept = jnp.where(kept_count > 0, kept, support)
    changed = jnp.max(jnp.where((kept_count > 0) & (kept_count < count), 1, 0)) > 0
    return kept, tau, changed

  # Ends on a support that keeps all of its entries: tau is that support's threshold.
  _, tau, _ = lax.while_loop(dropping, michelot, (member, jnp.zeros_like(b), jnp.asarray(True)))
  plan = jnp.where(member & real_line, jnp.maximum(u - tau, 0), 0)
  return plan, (low, low_at)


def _kernel(ct_ref, a_ref, b_ref, gamma_ref, lr_ref, plan_ref, *alpha_ref, m: int, n: int,
            k: int, num_steps: int, axis: int, reload_costs: bool, incremental: bool):
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
  real_line = lax.broadcasted_iota(jnp.int32, b.shape, 1 - axis) < n

  def plan(alpha, pivot):
    make_u = lambda: alpha / gamma - (costs() if reload_costs else held)
    if incremental:
      return _project_incremental(make_u(), b, k, axis, real_line, pivot)
    return _project(make_u, b, k, axis, rebuild_u=reload_costs), pivot

  def step(i, carry):
    alpha, mu, nu, pivot = carry
    t, pivot = plan(alpha, pivot)
    grad = a - jnp.sum(t, axis=1 - axis, keepdims=True)
    return (*optim.adam_update(i, alpha, mu, nu, grad, lr), pivot)

  zeros = jnp.zeros_like(a)
  # The incremental selection carries each line's k-th entry from step to step.
  no_member = ((jnp.full_like(b, jnp.inf), jnp.full(b.shape, -1, jnp.int32)) if incremental
               else ())
  alpha, _, _, pivot = lax.fori_loop(0, num_steps, step, (zeros, zeros, zeros, no_member))
  plan_ref[...] = plan(alpha, pivot)[0].astype(plan_ref.dtype)
  if alpha_ref:                                                        # return_alpha
    alpha_ref[0][...] = alpha.astype(alpha_ref[0].dtype)


def batched_semi_dual_adam_pallas(C: Array, a: Array, b: Array, k: int, gamma, num_steps: int,
                                  learning_rate, *, interpret: Optional[bool] = None,
                                  num_warps: Optional[int] = None,
                                  block_layout: str = "mn",
                                  reload_costs: bool = False,
                                  selection: str = "passes",
                                  return_alpha: bool = False):
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
  selection: how each step finds a line's k members: "passes" (the default) takes
    the k largest one by one, k passes of two reductions; "incremental" starts
    from the previous step's k-th entry and adds or drops entries until k
    remain, then finds the threshold by Michelot's rule (`_project_incremental`):
    at the B/32 routing shapes, 4 passes per step on average instead of 16 (a
    group's 32 columns in lockstep), 14 reductions instead of 32
    (benchmarks/selection_passes.py). The same members, the same plans up to
    the rounding of the threshold's sum; unmeasured on a GPU.
  return_alpha: also return alpha (G, m), the final iterate (one more small
    output block; without it the kernel is unchanged).

  float16 / bfloat16 inputs are computed and returned in float32
  (`ot.precision`). Raises ValueError when differentiated (the kernel has no
  derivative; it gave zero gradients before): `batched_semi_dual_adam` is
  the differentiable form of the same iterates.
  """
  if block_layout not in _LAYOUTS:
    raise ValueError(f"block_layout must be one of {_LAYOUTS}, got {block_layout!r}")
  if selection not in _SELECTIONS:
    raise ValueError(f"selection must be one of {_SELECTIONS}, got {selection!r}")
  if k < 1:
    raise ValueError(f"k must be >= 1, got {k}")
  if num_warps is not None and num_warps not in _WARPS:
    raise ValueError(f"num_warps must be one of {_WARPS}, got {num_warps}")
  C, a, b, gamma, learning_rate = validation.not_differentiable(
      "ot.batched_semi_dual_adam_pallas cannot be differentiated: use "
      "ot.batched_semi_dual_adam (the same iterates), or stop_gradient its inputs",
      precision.upcast((C, a, b, gamma, learning_rate)))
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
                             reload_costs=reload_costs,
                             incremental=selection == "incremental")
  compiler_params = None
  if not interpret:
    warps = num_warps or 4
    compiler_params = plgpu.CompilerParams(num_warps=warps, num_stages=1)
  out_shape = [jax.ShapeDtypeStruct((g, *block), dtype)]
  out_specs = [pl.BlockSpec((None, *block), lambda i: (i, 0, 0))]
  if return_alpha:
    out_shape.append(jax.ShapeDtypeStruct((g, *a_block), dtype))
    out_specs.append(pl.BlockSpec((None, *a_block), lambda i: (i, 0, 0)))
  outs = pl.pallas_call(
      kernel,
      out_shape=out_shape,
      grid=(g,),
      in_specs=[
          pl.BlockSpec((None, *block), lambda i: (i, 0, 0)),
          pl.BlockSpec((None, *a_block), lambda i: (i, 0, 0)),
          pl.BlockSpec((None, *b_block), lambda i: (i, 0, 0)),
          pl.BlockSpec((1, 1), lambda i: (0, 0)),
          pl.BlockSpec((1, 1), lambda i: (0, 0)),
      ],
      out_specs=out_specs,
      interpret=interpret,
      compiler_params=compiler_params,
      name="sparse_ot_semi_dual_adam",
  )(ct, a_col, b_row, gamma, lr)
  plan = outs[0]
  if axis == 1:
    plan = jnp.swapaxes(plan, 1, 2)
  plan = plan[:, :m, :n]
  if return_alpha:
    return plan, outs[1].reshape(g, -1)[:, :m]
  return plan
