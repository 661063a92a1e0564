"""Regularizers Omega of the columns of a transport plan, with their conjugates.

Each regularizer acts on the columns t_j of a plan (m, n) and provides, column by
column (`axis` is the length-m axis, 0 for an (m, n) matrix):

- `conj_plus(s)`: Omega*_+(s) = max_{t >= 0} <s, t> - Omega(t), and its gradient
  (the maximiser t).
- `conj_simplex(s, b)`: Omega*_b(s) = max_{t in b * simplex} <s, t> - Omega(t),
  its gradient (the maximiser t, a plan column of mass b) and its derivative in b.
- `primal(t)`: the convex value Omega**(t) the dual/semi-dual optimum actually
  solves for (Proposition 2, primal interpretation); for `SparsityConstrained` this is
  gamma * Psi(t), Psi the squared k-support norm.

gamma scaling follows the paper: (gamma f)* = gamma f*(. / gamma) (Table 1).
Regularizers are pytrees: gamma is a leaf (may be traced), k is static.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.scipy.special import logsumexp, xlogy

from vmoe_sparse_ot.ot import ksupport
from vmoe_sparse_ot.ot import precision
from vmoe_sparse_ot.ot import projections
from vmoe_sparse_ot.ot import selection

Array = jax.Array


def _is_concrete(x) -> bool:
  return not isinstance(x, jax.core.Tracer)


def _check_gamma(gamma, name: str = "gamma"):
  if _is_concrete(gamma):
    try:
      g = float(gamma)
    except (TypeError, ValueError):
      raise ValueError(f"{name} must be a positive finite number, got {gamma!r}") from None
    if not (g > 0 and g < float("inf")):
      raise ValueError(f"{name} must be a positive finite number, got {gamma!r}")


class Regularizer:
  """Base class. Subclasses define the conjugates for gamma via `self.gamma`."""

  gamma: float

  def tree_flatten(self):
    return (self.gamma,), None

  @classmethod
  def tree_unflatten(cls, aux, children):
    del aux
    obj = object.__new__(cls)
    obj.gamma = children[0]
    return obj

  def validate(self):
    _check_gamma(self.gamma)

  def conj_plus(self, s: Array, axis: int = 0):
    raise NotImplementedError

  def conj_simplex(self, s: Array, b, axis: int = 0):
    raise NotImplementedError

  def primal(self, t: Array, axis: int = 0) -> Array:
    raise NotImplementedError

  def __repr__(self):
    return f"{type(self).__name__}(gamma={self.gamma!r})"


def _simplex_value(t: Array, tau: Array, bb: Array, gamma, axis: int) -> Array:
  """<s, t> - gamma/2 ||t||^2 for t = [s / gamma - tau]_+ (on its support) in
  the b-scaled simplex: gamma/2 ||t||^2 + gamma tau b, since s / gamma = t + tau
  where t > 0 and sum(t) = b. tau: keepdims, bb: b expanded like it.

  Summing gamma t (s / gamma - t / 2) instead multiplies the rounding of
  sum(t) (which the threshold's rounding moves by ~m eps |s| / gamma) by tau:
  in float32 at 50,000 x 10 with k = 5750 that put a 3e-4 relative error on
  the semi-dual's value, more than the progress L-BFGS's line search then had
  to see.
  """
  return 0.5 * gamma * jnp.sum(t * t, axis=axis) + gamma * jnp.squeeze(tau * bb, axis)


def _bexpand(b, s: Array, axis: int) -> Array:
  b = jnp.asarray(b, s.dtype)
  if b.ndim == s.ndim - 1:
    b = jnp.expand_dims(b, axis % s.ndim)
  return b


@jax.tree_util.register_pytree_node_class
class NegEntropy(Regularizer):
  """Omega(t) = gamma <t, log t> (Shannon negentropy, Table 1; Sinkhorn's)."""

  def __init__(self, gamma: float = 1.0):
    _check_gamma(gamma)
    self.gamma = gamma

  @precision.half_in_float32
  def conj_plus(self, s, axis=0):
    g = jnp.exp(s / self.gamma - 1)
    return self.gamma * jnp.sum(g, axis=axis), g

  @precision.half_in_float32
  def conj_simplex(self, s, b, axis=0):
    """gamma b logsumexp(s / gamma) - gamma b log b; gradient b softmax(s / gamma)."""
    bb = _bexpand(b, s, axis)
    u = s / self.gamma
    lse = logsumexp(u, axis=axis, keepdims=True)
    t = bb * jnp.exp(u - lse)
    val = self.gamma * (bb * lse - xlogy(bb, bb))
    # d/db = gamma (lse - log b - 1).
    dval_db = self.gamma * (lse - jnp.log(bb) - 1)
    return jnp.squeeze(val, axis), t, jnp.squeeze(dval_db, axis)

  @precision.half_in_float32
  def primal(self, t, axis=0):
    return self.gamma * jnp.sum(xlogy(t, t), axis=axis)


@jax.tree_util.register_pytree_node_class
class SquaredL2(Regularizer):
  """Omega(t) = gamma / 2 ||t||^2 (Table 1)."""

  def __init__(self, gamma: float = 1.0):
    _check_gamma(gamma)
    self.gamma = gamma

  @precision.half_in_float32
  def conj_plus(self, s, axis=0):
    p = jnp.maximum(s, 0) / self.gamma
    return 0.5 * self.gamma * jnp.sum(p * p, axis=axis), p

  @precision.half_in_float32
  def conj_simplex(self, s, b, axis=0):
    """<s, t> - gamma/2 ||t||^2 at t = proj_{b simplex}(s / gamma)."""
    bb = _bexpand(b, s, axis)
    u = s / self.gamma
    tau = projections.simplex_threshold(u, bb, axis)
    t = jnp.maximum(u - tau, 0)
    val = _simplex_value(t, tau, bb, self.gamma, axis)
    return val, t, self.gamma * jnp.squeeze(tau, axis)

  @precision.half_in_float32
  def primal(self, t, axis=0):
    return 0.5 * self.gamma * jnp.sum(t * t, axis=axis)


@jax.tree_util.register_pytree_node_class
class SparsityConstrained(Regularizer):
  """Omega(t) = gamma / 2 ||t||^2 + indicator(||t||_0 <= k) (paper eq. Omega_l2_l0).

  At most k nonzeros per column of the plan. k >= m (the column length) makes the
  constraint vacuous: the regularizer then behaves exactly as `SquaredL2(gamma)`
  (POT's `ot.smooth` crashes there). k = 1 uses the closed forms of
  Proposition 4 (limit cases).
  """

  def __init__(self, k: int, gamma: float = 1.0):
    if isinstance(k, np.integer):   # numpy integers are fine
      k = int(k)
    if isinstance(k, bool) or not isinstance(k, int):
      raise ValueError(f"k must be a Python int >= 1, got {k!r}")
    if k < 1:
      raise ValueError(f"k must be a Python int >= 1, got {k!r}")
    _check_gamma(gamma)
    self.k = k
    self.gamma = gamma

  def tree_flatten(self):
    return (self.gamma,), self.k

  @classmethod
  def tree_unflatten(cls, aux, children):
    obj = object.__new__(cls)
    obj.k = aux
    obj.gamma = children[0]
    return obj

  def validate(self):
    if self.k < 1:
      raise ValueError(f"k must be a Python int >= 1, got {self.k!r}")
    _check_gamma(self.gamma)

  def __repr__(self):
    return f"SparsityConstrained(k={self.k!r}, gamma={self.gamma!r})"

  def compact(self, m: int, dtype, minor_axis: bool) -> bool:
    """Whether columns of length m are handled in compact form (k entries each).

    True for small k (the selection passes give the k entries directly); False
    for k >= m and for large k, where the radix-selected mask is used densely.
    minor_axis: whether the columns lie along the array's contiguous axis (the
    semi-dual's dense (n, m) layout), where the radix kernel wins earlier.
    """
    return self.k < m and not selection.uses_radix(self.k, m, dtype, minor_axis)

  @precision.half_in_float32
  def conj_plus(self, s, axis=0):
    """1/(2 gamma) sum_{i<=k} [s_[i]]_+^2; gradient [topk(s)]_+ / gamma."""
    axis = axis % s.ndim
    m = s.shape[axis]
    if self.k >= m:
      return SquaredL2(self.gamma).conj_plus(s, axis)
    if not self.compact(m, s.dtype, axis == s.ndim - 1):
      mask = selection.threshold_top_k_mask(s, self.k, axis)
      p = jnp.where(mask, jnp.maximum(s, 0), 0) / self.gamma
      return 0.5 * self.gamma * jnp.sum(p * p, axis=axis), p
    val, p, idx = self.conj_plus_sparse(s, axis)
    return val, selection.densify(p, idx, m, axis)

  @precision.half_in_float32
  def conj_plus_sparse(self, s, axis=0):
    """`conj_plus` with the maximiser in compact form (requires k < m; any k,
    but for large k the selection sorts: see `compact`).

    Returns (value, p, indices): the maximiser's k candidate entries
    p = [top-k(s)]_+ / gamma and their int32 positions along `axis`.
    """
    values, idx = selection.top_k(s, self.k, axis)
    p = jnp.maximum(values, 0) / self.gamma
    return 0.5 * self.gamma * jnp.sum(p * p, axis=axis), p, idx

  @precision.half_in_float32
  def conj_simplex(self, s, b, axis=0):
    """gamma/2 sum_{i<=k} 1[u_[i] >= tau] (u_[i]^2 - tau^2), u = s / gamma."""
    axis = axis % s.ndim
    m = s.shape[axis]
    if self.k >= m:
      return SquaredL2(self.gamma).conj_simplex(s, b, axis)
    if not self.compact(m, s.dtype, axis == s.ndim - 1) and self.k > 1:
      bb = _bexpand(b, s, axis)
      u = s / self.gamma
      t, tau = projections.sparse_simplex_parts(u, self.k, bb, axis)
      val = _simplex_value(t, tau, bb, self.gamma, axis)
      return val, t, self.gamma * jnp.squeeze(tau, axis)
    val, sp, dval_db = self.conj_simplex_sparse(s, b, axis)
    return val, selection.densify(sp.values, sp.indices, m, axis), dval_db

  @precision.half_in_float32
  def conj_simplex_sparse(self, s, b, axis=0):
    """`conj_simplex` with the maximiser in compact form (requires k < m; any
    k, but for large k the selection sorts: see `compact`).

    Returns (value, `projections.SparseSimplex` (k entries along `axis`: the plan
    column's nonzeros and their positions), d value / d b). After the top-k
    selection everything costs O(k) per column, which is what makes the
    semi-dual's evaluation cheap (`objectives.semi_dual_value_and_grad`).
    """
    axis = axis % s.ndim
    bb = _bexpand(b, s, axis)
    if self.k == 1:
      # Proposition 4 (limit cases): b max(s) - gamma/2 b^2, the mass on the first argmax.
      smax, idx = selection.top_k(s, 1, axis)
      val = jnp.squeeze(bb * smax - 0.5 * self.gamma * bb * bb, axis)
      sp = projections.SparseSimplex(jnp.broadcast_to(bb, smax.shape).astype(s.dtype), idx,
                                     smax / self.gamma - bb, (bb > 0).astype(s.dtype),
                                     jnp.where(bb > 0, smax * smax, 0) / self.gamma ** 2)
      return val, sp, jnp.squeeze(smax - self.gamma * bb, axis)
    sp = projections.sparse_simplex_topk(s / self.gamma, self.k, bb, axis)
    # gamma/2 sum_active (u_i^2 - tau^2) (Table 1), written as in _simplex_value.
    val = _simplex_value(sp.values, sp.tau, bb, self.gamma, axis)
    return val, sp, self.gamma * jnp.squeeze(sp.tau, axis)

  @precision.half_in_float32
  def primal(self, t, axis=0):
    return self.gamma * ksupport.squared_k_support_norm(t, self.k, axis)

  @precision.half_in_float32
  def nonconvex_value(self, t, axis=0):
    """Omega(t) itself: gamma/2 ||t||^2, or +inf where a column has > k nonzeros."""
    nnz = jnp.sum(t != 0, axis=axis)
    return jnp.where(nnz <= self.k, 0.5 * self.gamma * jnp.sum(t * t, axis=axis), jnp.inf)


del lax
