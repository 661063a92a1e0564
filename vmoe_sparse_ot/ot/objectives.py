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

from vmoe_sparse_ot.ot import precision
from vmoe_sparse_ot.ot import selection
from vmoe_sparse_ot.ot.regularizers import Regularizer, SparsityConstrained

Array = jax.Array


@precision.half_in_float32
def semi_dual_value_and_grad(alpha: Array, a: Array, b: Array, C: Array,
                             reg: Regularizer,
                             C_t: Array | None = None) -> Tuple[Array, Array, Array]:
  """S(alpha) = <alpha, a> - sum_j Omega*_{b_j}(alpha - c_j).

  Returns (value, gradient a - T 1_n, plan T (m, n)), T = semi-dual plan.

  Dense columns (every regularizer but a compact SparsityConstrained) are
  computed in the transposed (n, m) layout: their per-column reductions
  (thresholds, radix counts) then run along contiguous memory, where XLA's CPU
  backend vectorises them and fuses several into one loop (variadic
  reductions) (docs/OT.md, "Kernel timings"). C_t: optionally C.T. Pass it when evaluating in a
  loop: XLA does not hoist the transpose out of a while loop.
  """
  m = C.shape[0]
  # Dense columns are evaluated along the minor axis of (n, m), compact ones in (m, n).
  if isinstance(reg, SparsityConstrained) and reg.compact(m, C.dtype, minor_axis=True):
    # Compact columns: the row sums T 1_n are a scatter-add of the k * n nonzeros
    # instead of a pass over an (m, n) plan; the dense plan is only formed if the
    # caller uses it (inside the solvers' loops it is dead code).
    vals, sp, _ = reg.conj_simplex_sparse(alpha[:, None] - C, b, axis=0)
    row_sums = jnp.zeros_like(alpha).at[sp.indices].add(sp.values)
    T = selection.densify(sp.values, sp.indices, m, axis=0)
  else:
    C_t = C.T if C_t is None else C_t
    vals, T_t, _ = reg.conj_simplex(alpha[None, :] - C_t, b, axis=1)
    row_sums, T = jnp.sum(T_t, axis=0), T_t.T
  value = jnp.dot(alpha, a) - jnp.sum(vals)
  return value, a - row_sums, T


@precision.half_in_float32
def semi_dual_objective(alpha: Array, a: Array, b: Array, C: Array, reg: Regularizer) -> Array:
  """The semi-dual objective value (eq. reg_semi_dual before the max)."""
  return semi_dual_value_and_grad(alpha, a, b, C, reg)[0]


@precision.half_in_float32
def dual_value_and_grad(alpha: Array, beta: Array, a: Array, b: Array, C: Array,
                        reg: Regularizer) -> Tuple[Array, Tuple[Array, Array], Array]:
  """D(alpha, beta) = <alpha, a> + <beta, b> - sum_j Omega*_+(alpha + beta_j - c_j).

  Returns (value, (grad_alpha, grad_beta), plan T).
  """
  m = C.shape[0]
  # conj_plus runs along axis 0 of (m, n), the major axis: the same decision
  # as inside it.
  if isinstance(reg, SparsityConstrained) and reg.compact(m, C.dtype, minor_axis=False):
    # Compact columns, as in semi_dual_value_and_grad.
    vals, p, idx = reg.conj_plus_sparse(alpha[:, None] + beta[None, :] - C, axis=0)
    row_sums, col_sums = jnp.zeros_like(alpha).at[idx].add(p), jnp.sum(p, axis=0)
    T = selection.densify(p, idx, m, axis=0)
  else:
    vals, T = reg.conj_plus(alpha[:, None] + beta[None, :] - C, axis=0)
    row_sums, col_sums = jnp.sum(T, axis=1), jnp.sum(T, axis=0)
  value = jnp.dot(alpha, a) + jnp.dot(beta, b) - jnp.sum(vals)
  return value, (a - row_sums, b - col_sums), T


@precision.half_in_float32
def dual_objective(alpha: Array, beta: Array, a: Array, b: Array, C: Array,
                   reg: Regularizer) -> Array:
  """The dual objective value (eq. reg_dual before the max)."""
  return dual_value_and_grad(alpha, beta, a, b, C, reg)[0]


@precision.half_in_float32
def plan_from_semi_dual(alpha: Array, b: Array, C: Array, reg: Regularizer) -> Array:
  """t_j = grad Omega*_{b_j}(alpha - c_j) (eq. semi_dual_primal_link)."""
  return reg.conj_simplex(alpha[:, None] - C, b, axis=0)[1]


@precision.half_in_float32
def plan_from_dual(alpha: Array, beta: Array, C: Array, reg: Regularizer) -> Array:
  """t_j = grad Omega*_+(alpha + beta_j - c_j) (eq. dual_primal_link)."""
  return reg.conj_plus(alpha[:, None] + beta[None, :] - C, axis=0)[1]


@precision.half_in_float32
def primal_objective(T: Array, C: Array, reg: Regularizer) -> Array:
  """<T, C> + sum_j Omega**(t_j): P_Psi for SparsityConstrained, P_Omega otherwise.

  Marginal constraints are not checked here (see `marginal_errors`).
  """
  return jnp.sum(T * C) + jnp.sum(reg.primal(T, axis=0))


@precision.half_in_float32
def marginal_errors(T: Array, a: Array, b: Array) -> Tuple[Array, Array]:
  """Max-abs violation of the row (T 1 = a) and column (T^T 1 = b) marginals."""
  return jnp.max(jnp.abs(jnp.sum(T, 1) - a)), jnp.max(jnp.abs(jnp.sum(T, 0) - b))
