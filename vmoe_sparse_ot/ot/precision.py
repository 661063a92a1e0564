"""The half-precision policy of `ot`: float16 and bfloat16 are computed in float32.

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
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

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

