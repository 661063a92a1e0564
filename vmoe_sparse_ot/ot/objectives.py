"""Dual, semi-dual and primal objectives, and plan recovery (paper section 3).

Conventions: C is (m, n), a (m,), b (n,); the constraint and the
regularizer act on the columns t_j = T[:, j]. Objectives are maximised (dual and
semi-dual) or minimised (primal). The value-and-gradient functions are written by
hand (one pass over C, no autodiff) because the solvers call them in their loop.
"""
from __future__ import annotations

from typing import Tuple

import jax
import jax.numpy as jnp

from vmoe_sparse_ot.ot import projections
from vmoe_sparse_ot.ot.regularizers import Regularizer, SparsityConstrained

Array = jax.Array


# Few columns: the per-column reductions (thresholds, radix counts) run along
# the minor axis of a transposed (n, m) layout, where XLA's CPU reductions
# vectorise over contiguous entries. One semi-dual evaluation near the optimum,
# one thread: 1.6-1.9x faster at n = 10, 1.2-1.4x at n = 16 and 32, slower at
# n = 64 and 100, where the (m, n) layout already vectorises across columns.
_COLUMNS_LAST_MAX_N = 32


def columns_last(n: int) -> bool:
  """Whether dense column computations on n columns use the (n, m) layout."""
  return n <= _COLUMNS_LAST_MAX_N


def semi_dual_value_and_grad(alpha: Array, a: Array, b: Array, C: Array,
                             reg: Regularizer,
                             C_t: Array | None = None) -> Tuple[Array, Array, Array]:
  """S(alpha) = <alpha, a> - sum_j Omega*_{b_j}(alpha - c_j).

  Returns (value, gradient a - T 1_n, plan T (m, n)), T = semi-dual plan.
  C_t: optionally C.T (n, m), used where `columns_last(n)`. Pass it when
  evaluating in a loop: XLA does not hoist the transpose out of a while loop,
  and at 50,000 x 10 it cost ~1.5 ms of every evaluation.
  """
  return semi_dual_warm(alpha, None, a, b, C, reg, C_t)[:3]


def semi_dual_warm(alpha: Array, start, a: Array, b: Array, C: Array, reg: Regularizer,
                   C_t: Array | None = None):
  """`semi_dual_value_and_grad` from a warm start: (value, gradient, plan, next start).

  start: the next start returned by an evaluation at a nearby alpha (None the
  first time): the per-column thresholds the regularizer finds iteratively
  (`Regularizer.conj_simplex_warm`), which then take one or two passes instead
  of five to nine. The value and gradient do not depend on it.
  """
  m = C.shape[0]
  if isinstance(reg, SparsityConstrained) and reg.compact(m, C.dtype):
    # Compact columns: the row sums T 1_n are a scatter-add of the k * n nonzeros
    # instead of a pass over an (m, n) plan; the dense plan is only formed if the
    # caller uses it (inside the solvers' loops it is dead code).
    vals, sp, _ = reg.conj_simplex_sparse(alpha[:, None] - C, b, axis=0)
    row_sums = jnp.zeros_like(alpha).at[sp.indices].add(sp.values)
    T = projections.densify(sp.values, sp.indices, m, axis=0)
    start = None
  elif columns_last(C.shape[1]):
    C_t = C.T if C_t is None else C_t
    vals, T_t, _, start = reg.conj_simplex_warm(alpha[None, :] - C_t, b, 1, start)
    row_sums, T = jnp.sum(T_t, axis=0), T_t.T
  else:
    vals, T, _, start = reg.conj_simplex_warm(alpha[:, None] - C, b, 0, start)
    row_sums = jnp.sum(T, axis=1)
  value = jnp.dot(alpha, a) - jnp.sum(vals)
  return value, a - row_sums, T, start


def semi_dual_objective(alpha: Array, a: Array, b: Array, C: Array, reg: Regularizer) -> Array:
  """The semi-dual objective value (eq. reg_semi_dual before the max)."""
  return semi_dual_value_and_grad(alpha, a, b, C, reg)[0]


def dual_value_and_grad(alpha: Array, beta: Array, a: Array, b: Array, C: Array,
                        reg: Regularizer) -> Tuple[Array, Tuple[Array, Array], Array]:
  """D(alpha, beta) = <alpha, a> + <beta, b> - sum_j Omega*_+(alpha + beta_j - c_j).

  Returns (value, (grad_alpha, grad_beta), plan T).
  """
  m = C.shape[0]
  if isinstance(reg, SparsityConstrained) and reg.compact(m, C.dtype):
    # Compact columns, as in semi_dual_value_and_grad.
    vals, p, idx = reg.conj_plus_sparse(alpha[:, None] + beta[None, :] - C, axis=0)
    row_sums, col_sums = jnp.zeros_like(alpha).at[idx].add(p), jnp.sum(p, axis=0)
    T = projections.densify(p, idx, m, axis=0)
  else:
    vals, T = reg.conj_plus(alpha[:, None] + beta[None, :] - C, axis=0)
    row_sums, col_sums = jnp.sum(T, axis=1), jnp.sum(T, axis=0)
  value = jnp.dot(alpha, a) + jnp.dot(beta, b) - jnp.sum(vals)
  return value, (a - row_sums, b - col_sums), T


def dual_objective(alpha: Array, beta: Array, a: Array, b: Array, C: Array,
                   reg: Regularizer) -> Array:
  """The dual objective value (eq. reg_dual before the max)."""
  return dual_value_and_grad(alpha, beta, a, b, C, reg)[0]


def plan_from_semi_dual(alpha: Array, b: Array, C: Array, reg: Regularizer) -> Array:
  """t_j = grad Omega*_{b_j}(alpha - c_j) (eq. semi_dual_primal_link)."""
  return reg.conj_simplex(alpha[:, None] - C, b, axis=0)[1]


def plan_from_dual(alpha: Array, beta: Array, C: Array, reg: Regularizer) -> Array:
  """t_j = grad Omega*_+(alpha + beta_j - c_j) (eq. dual_primal_link)."""
  return reg.conj_plus(alpha[:, None] + beta[None, :] - C, axis=0)[1]


def primal_objective(T: Array, C: Array, reg: Regularizer) -> Array:
  """<T, C> + sum_j Omega**(t_j): P_Psi for SparsityConstrained, P_Omega otherwise.

  Marginal constraints are not checked here (see `marginal_errors`).
  """
  return jnp.sum(T * C) + jnp.sum(reg.primal(T, axis=0))


def marginal_errors(T: Array, a: Array, b: Array) -> Tuple[Array, Array]:
  """Max-abs violation of the row (T 1 = a) and column (T^T 1 = b) marginals."""
  return jnp.max(jnp.abs(jnp.sum(T, 1) - a)), jnp.max(jnp.abs(jnp.sum(T, 0) - b))
