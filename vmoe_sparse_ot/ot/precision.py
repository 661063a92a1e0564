"""The digits a solve needs: half precision computed in float32, cost offsets removed.

Half precision keeps 3 (bfloat16: 2-3) significant digits. A simplex
threshold sums a column's entries, a Sinkhorn or Adam step moves potentials
by small amounts, a marginal error is a difference of near-equal sums: in
half precision each loses the digits the result needs (a bfloat16 Sinkhorn
stalled 9e-3 off its marginals, never reaching tol = 1e-4). So every
function of `ot` that does arithmetic takes half-precision inputs to float32
first:

- the solvers (`solve`, `sinkhorn`, `solve_interior_point`, the batched
  router solvers) compute and return float32 (`compute_dtype`): their results
  come with claims (marginal errors, `converged`, duality gaps) made at
  float32's accuracy, which rounding the plan back to half precision would
  break (a bfloat16 entry is off by up to 2^-9 of itself);
- the array maps (projections, conjugates, objectives, the k-support norm)
  compute in float32 and return the inputs' dtype (`half_in_float32`): they
  are layers of a model, and a half-precision model keeps its dtype; the
  result is the float32 one rounded once.

The top-k selection only compares entries, which is exact in every dtype: it
works on the inputs as they are.

A cost offset common to a row or a column changes no plan (the potentials
absorb it), but it costs digits: u = (alpha_i - c_ij) / gamma is formed at
the offset's magnitude. C + 1e9 in float64 or C + 100 in float32 (C of 0 to
9, gamma 0.1) left sparsity-constrained solves short of their marginals.
`shift_costs` finds the offsets to take out first (exactly, where they
dominate: x - y is exact for y within a factor 2 of x).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

_HALF = (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16))


def is_half(dtype) -> bool:
  """Whether `dtype` is float16 or bfloat16."""
  return jnp.dtype(dtype) in _HALF


def compute_dtype(*xs):
  """The float dtype a solver computes in for inputs xs: their result type,
  the default float for integers, float32 for float16 / bfloat16."""
  dt = jnp.result_type(*xs)
  if not jnp.issubdtype(dt, jnp.floating):
    dt = jnp.result_type(float)
  return jnp.dtype(jnp.float32) if is_half(dt) else jnp.dtype(dt)


def _float_arrays(tree):
  return [x for x in jax.tree_util.tree_leaves(tree)
          if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)]


def upcast(tree):
  """tree with its float16 / bfloat16 array leaves cast to float32."""
  return jax.tree_util.tree_map(
      lambda x: x.astype(jnp.float32) if hasattr(x, "dtype") and is_half(x.dtype) else x, tree)


def half_in_float32(fn):
  """Decorates an array map: where its floating array arguments promote to
  float16 or bfloat16, it runs on them cast to float32 and its floating
  outputs are rounded back to that dtype. Otherwise `fn` runs as it is."""

  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    arrays = _float_arrays((args, kwargs))
    if not arrays:
      return fn(*args, **kwargs)
    out_dtype = jnp.result_type(*arrays)
    if not is_half(out_dtype):
      return fn(*args, **kwargs)
    out = fn(*upcast(args), **upcast(kwargs))
    return jax.tree_util.tree_map(
        lambda x: x.astype(out_dtype)
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) else x, out)

  return wrapped


# Offsets (`shift_costs`) are removed only where they exceed the costs' own
# spread: below that an offset costs at most a bit, and the problem is solved
# as given (tuned results stay as they were).
_OFFSET_RATIO = 1.0


def shift_costs(C):
  """(C - r - c, (r, c)): the costs without their row and column offsets, r
  (m,) the row minima and c (n,) the column minima of C - r, so that every
  row and column of the result has minimum 0; or (C, None) where the offsets
  are small against the result's range. C concrete: decided and computed on
  the host (numpy: nothing compiles); traced: zeros there.

  The caller solves the shifted costs (the same plans) and adds r and c back
  to the row and column potentials, <r, a> + <c, b> to the values."""
  concrete = not isinstance(C, jax.core.Tracer)
  xp = np if concrete else jnp
  C_ = np.asarray(C) if concrete else C
  r = xp.min(C_, axis=1)
  rows = C_ - r[:, None]
  c = xp.min(rows, axis=0)
  shifted = rows - c[None, :]
  extreme = xp.max(xp.abs(r)) + xp.max(xp.abs(c)) > _OFFSET_RATIO * xp.max(shifted)
  if concrete:
    if not extreme:
      return C, None
    return jnp.asarray(shifted), (jnp.asarray(r), jnp.asarray(c))
  zeros_r, zeros_c = jnp.zeros_like(r), jnp.zeros_like(c)
  return (jnp.where(extreme, shifted, C),
          (jnp.where(extreme, r, zeros_r), jnp.where(extreme, c, zeros_c)))
