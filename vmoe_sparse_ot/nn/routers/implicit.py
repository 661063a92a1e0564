"""Gradients of an OT router's plan by implicit differentiation through its solve.

The reference's OT routers differentiate their plans implicitly: the solver's
output alpha is taken as a root of the semi-dual's gradient,
    F(alpha, C) = a - T(alpha, C) 1 = 0,
so d alpha = -(dF/d alpha)^-1 dF/dC dC, whatever iterations produced alpha
(after a fixed small number of them alpha is not the exact root; the gradient is
the one of the root, as there). The linear system is solved by least squares:
the semi-dual's Hessian is singular where a token lies in no column's support.
"""
import jax
import jax.numpy as jnp

from vmoe_sparse_ot import ot

Array = jax.Array


def _least_squares(linear, y: Array) -> Array:
  """x minimizing ||linear(x) - y||, linear: (m,) -> (m,) (a dense m x m solve)."""
  return jnp.linalg.lstsq(jax.jacobian(linear)(y), y)[0]


def semi_dual_root(alpha: Array, a: Array, b: Array, C: Array, reg: ot.Regularizer) -> Array:
  """`alpha` (m,), the solver's semi-dual potentials, with implicit gradients in C.

  Args: alpha (m,) from any solver (its own gradient is discarded); a (m,),
  b (n,), C (m, n) the problem (C may carry a gradient); reg its regularizer.
  Returns: alpha's value, differentiable in C as the root of a - T 1 = 0.
  """
  def optimality(x):
    return ot.semi_dual_value_and_grad(x, a, b, C, reg)[1]

  return jax.lax.custom_root(optimality, jax.lax.stop_gradient(alpha),
                             solve=lambda f, x: x, tangent_solve=_least_squares)


def semi_dual_plan(alpha: Array, a: Array, b: Array, C: Array, reg: ot.Regularizer) -> Array:
  """The plan (m, n) of the potentials `alpha` (m,), differentiated implicitly in C."""
  return ot.plan_from_semi_dual(semi_dual_root(alpha, a, b, C, reg), b, C, reg)
