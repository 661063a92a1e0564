"""Log-domain Sinkhorn (entropic OT baseline and the S-BASE router).

Solves min_T <T, C> + epsilon <T, log T> over couplings of a and b, i.e. the
`NegEntropy(epsilon)` problem of `solve`, by block coordinate ascent on the dual
potentials f (m,), g (n,) with T_ij = exp((f_i + g_j - C_ij) / epsilon):
    f = eps log a - eps logsumexp_j((g_j - C_ij) / eps)
    g = eps log b - eps logsumexp_i((f_i - C_ij) / eps)
After each g-update the column marginals hold up to rounding, so the loop tests
the row-marginal violation max_i |T 1 - a|_i; the error reported at the end is
the larger of the row and column violations of the returned plan (at extreme
ratios of C to epsilon the rounding of f + g - C, not the iterations, sets
them), and `converged` needs both within tol.
"""
from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy.special import logsumexp, xlogy

from vmoe_sparse_ot.ot import precision
from vmoe_sparse_ot.ot import results
from vmoe_sparse_ot.ot import validation

Array = jax.Array


class SinkhornResult(NamedTuple):
  """plan (m, n); potentials f (m,), g (n,); value = <T, C> + eps <T, log T>;
  num_iter; converged (error <= tol; False for tol == 0); error: the plan's
  largest marginal violation, max(max_i |T 1 - a|_i, max_j |T^T 1 - b|_j)
  (NaN where the plan is not finite)."""
  plan: Array
  f: Array
  g: Array
  value: Array
  num_iter: Array
  converged: Array
  error: Array


def sinkhorn(a, b, C, epsilon, max_iter: int = 1000, tol: float = 1e-6,
             init: Optional[Any] = None) -> SinkhornResult:
  """Entropic OT in the log domain; runs under jit and vmap.

  Args:
    a: (m,) non-negative row marginal; b: (n,) column marginal of equal mass
      (to the dtype's tolerance, `validation.mass_rtol`; b is rescaled to
      sum(a), without which the iterations could not meet both marginals).
    C: (m, n) finite real cost, any sign (C + const gives the same plan).
    epsilon: entropic regularization > 0 (may be traced).
    max_iter: Python int >= 1. tol: Python float >= 0; tol == 0 runs exactly
      max_iter iterations as a fixed-length loop.
    init: (f, g) warm start, or a previous SinkhornResult.

  Returns:
    SinkhornResult in the inputs' float dtype (float16 / bfloat16 inputs are
    computed and returned in float32: see `ot.precision`).

  Raises:
    ValueError naming the argument, before compiling (as `ot.solve`); and
    when differentiated with tol > 0 (its loop stops on a data-dependent
    test, which JAX cannot differentiate in reverse mode): tol = 0 runs a
    fixed number of iterations, differentiable through the unrolled loop.
  """
  max_iter = validation.check_int("max_iter", max_iter, 1)
  tol = validation.check_nonneg_float("tol", tol)
  validation.check_pos_float("epsilon", epsilon)
  validation.check_problem(a, b, C)
  if tol > 0:
    a, b, C, epsilon, init = validation.not_differentiable(
        "ot.sinkhorn with tol > 0 cannot be differentiated (its loop stops on a "
        "data-dependent test): pass tol=0 to differentiate through max_iter iterations, "
        "or stop_gradient its inputs", (a, b, C, epsilon, init))
  dt = precision.compute_dtype(a, b, C)   # half precision: float32
  m, n = C.shape
  if init is None:
    f0, g0 = jnp.zeros((m,), dt), jnp.zeros((n,), dt)
  else:
    if isinstance(init, SinkhornResult):
      f0, g0 = init.f, init.g
    else:
      f0, g0 = init
    f0, g0 = jnp.asarray(f0, dt), jnp.asarray(g0, dt)
    if f0.shape != (m,) or g0.shape != (n,):
      raise ValueError(f"init must be (f, g) of shapes ({m},), ({n},)")
  return _sinkhorn(jnp.asarray(a, dt), jnp.asarray(b, dt), jnp.asarray(C, dt),
                   jnp.asarray(epsilon, dt), f0, g0, max_iter=max_iter, tol=tol)


def _safe_log(x):
  return jnp.where(x > 0, jnp.log(jnp.where(x > 0, x, 1)), -jnp.inf)


@functools.partial(jax.jit, static_argnames=("max_iter", "tol"))
def _sinkhorn(a, b, C, eps, f0, g0, *, max_iter, tol):
  b = results.matched_mass(b, a)
  log_a, log_b = _safe_log(a), _safe_log(b)

  def f_update(g):
    return eps * log_a - eps * logsumexp((g[None, :] - C) / eps, axis=1)

  def g_update(f):
    return eps * log_b - eps * logsumexp((f[:, None] - C) / eps, axis=0)

  def error(f, g):
    logT = (f[:, None] + g[None, :] - C) / eps
    return jnp.max(jnp.abs(jnp.sum(jnp.exp(logT), axis=1) - a))

  if tol == 0:
    def body(_, fg):
      f, g = fg
      f = f_update(g)
      return f, g_update(f)
    f, g = lax.fori_loop(0, max_iter, body, (f0, g0))
    it = jnp.asarray(max_iter, jnp.int32)
  else:
    def cond(c):
      i, _, _, err = c
      return (i < max_iter) & (err > tol)

    def body(c):
      i, f, g, _ = c
      f = f_update(g)
      g = g_update(f)
      return i + 1, f, g, error(f, g)

    it, f, g, err = lax.while_loop(
        cond, body, (jnp.asarray(0, jnp.int32), f0, g0, jnp.asarray(jnp.inf, a.dtype)))
  T = jnp.exp((f[:, None] + g[None, :] - C) / eps)
  # The returned plan's own violations, rows and columns: the loop's test
  # assumes the columns exact, which the rounding of f + g - C breaks where C
  # is huge against eps.
  err = jnp.maximum(jnp.max(jnp.abs(jnp.sum(T, axis=1) - a)),
                    jnp.max(jnp.abs(jnp.sum(T, axis=0) - b)))
  err = jnp.where(jnp.all(jnp.isfinite(T)), err, jnp.nan)
  converged = jnp.asarray(False) if tol == 0 else err <= tol
  value = jnp.sum(T * C) + eps * jnp.sum(xlogy(T, T))
  return SinkhornResult(plan=T, f=f, g=g, value=value, num_iter=it, converged=converged,
                        error=err)
