"""Argument checks run before any compilation; each error names the argument.

Shape and option checks always run; value checks (sign, finiteness, total mass)
only on concrete inputs, so `solve` and `sinkhorn` still work on tracers under
`jit` / `vmap`.
"""
from __future__ import annotations

import functools
import numbers

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _guard(message: str, xs):
  return xs


@_guard.defjvp
def _guard_jvp(message, primals, tangents):
  raise ValueError(message)


def not_differentiable(message: str, tree):
  """`tree` unchanged; differentiating through its traced leaves (forward or
  reverse mode, under jit or not) raises ValueError(message), one line.

  For the entry points whose loops stop on data-dependent tests: JAX cannot
  transpose those loops, and its own error names a `while_loop` the caller
  never wrote. Concrete leaves are left alone (no device transfer eagerly);
  where nothing is differentiated the guard is an identity that compiles to
  nothing.
  """
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  traced = [i for i, x in enumerate(leaves) if isinstance(x, jax.core.Tracer)]
  if not traced:
    return tree
  # The copy (which XLA drops) makes each leaf an operation of the current
  # trace: a vmap over a numpy argument inside jit otherwise hands the custom
  # JVP a numpy constant, which JAX refuses ("non-canonical constant").
  guarded = _guard(message, tuple(jnp.array(leaves[i], copy=True) for i in traced))
  for i, x in zip(traced, guarded):
    leaves[i] = x
  return jax.tree_util.tree_unflatten(treedef, leaves)


def check_problem(a, b, C):
  """Checks marginals a (m,), b (n,) and cost C (m, n).

  Any finite real cost is accepted: adding a constant to C changes no plan
  (the dual and semi-dual potentials absorb it), so its sign means nothing.
  """
  for name, x, nd in (("a", a, 1), ("b", b, 1), ("C", C, 2)):
    shape = getattr(x, "shape", None)
    if shape is None:
      raise ValueError(f"{name} must be an array, got {type(x).__name__}")
    if len(shape) != nd:
      raise ValueError(f"{name} must have {nd} dimension(s), got shape {tuple(shape)}")
    if 0 in shape:
      raise ValueError(f"{name} must not be empty, got shape {tuple(shape)}")
    dt = np.dtype(getattr(x, "dtype", np.float64))
    if not (jnp.issubdtype(dt, jnp.floating) or jnp.issubdtype(dt, jnp.integer)):
      raise ValueError(f"{name} must be a real array, got dtype {dt}")
  m, n = a.shape[0], b.shape[0]
  if tuple(C.shape) != (m, n):
    raise ValueError(
        f"C must have shape (len(a), len(b)) = ({m}, {n}), got {tuple(C.shape)}")
  sums = {}
  for name, x in (("a", a), ("b", b), ("C", C)):
    if not is_concrete(x):
      continue
    v = np.asarray(x, dtype=np.float64)
    if not np.all(np.isfinite(v)):
      raise ValueError(f"{name} must be finite (found NaN or inf)")
    if name != "C" and np.any(v < 0):
      raise ValueError(f"{name} must be non-negative (min {v.min()!r})")
    if name != "C":
      sums[name] = (float(v.sum()), np.dtype(x.dtype))
  if len(sums) == 2:
    (sa, da), (sb, db) = sums["a"], sums["b"]
    rtol = mass_rtol(da, db)
    if sa <= 0 or sb <= 0:
      raise ValueError(f"a and b must have positive total mass, got sum(a)={sa!r}, "
                       f"sum(b)={sb!r}")
    if not abs(sa - sb) <= rtol * max(abs(sa), abs(sb)):
      raise ValueError(
          f"a and b must have the same total mass (to {rtol:g} relative for their "
          f"dtypes): sum(a)={sa!r}, sum(b)={sb!r}")


def mass_rtol(*dtypes) -> float:
  """Relative tolerance on sum(a) = sum(b) for marginals of these dtypes.

  Normalising in a dtype leaves relative errors of a few units of its epsilon per
  entry; 1e-6 in float64 (users' normalisations), 1e-4 in float32, 16 epsilon in
  half precision (float16: 1.6e-2).
  """
  eps = max(float(jnp.finfo(d).eps) if jnp.issubdtype(d, jnp.floating) else 0.0
            for d in dtypes)
  if eps <= 1e-15:
    return 1e-6
  if eps <= 1e-6:
    return 1e-4
  return 16 * eps


def check_choice(name: str, value, choices):
  if value not in choices:
    raise ValueError(f"{name} must be one of {sorted(choices)}, got {value!r}")


def check_int(name: str, value, minimum: int):
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
    raise ValueError(f"{name} must be a Python int >= {minimum}, got {value!r}")
  return int(value)


def check_nonneg_float(name: str, value):
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
      0 <= float(value) < float("inf")):
    raise ValueError(f"{name} must be a finite Python float >= 0, got {value!r}")
  return float(value)


def check_pos_float(name: str, value):
  if is_concrete(value):
    try:
      v = float(value)
    except (TypeError, ValueError):
      raise ValueError(f"{name} must be a positive finite number, got {value!r}") from None
    if not (0 < v < float("inf")):
      raise ValueError(f"{name} must be a positive finite number, got {value!r}")
  return value
