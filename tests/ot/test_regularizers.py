"""The regularizers (ot/regularizers.py): Table 1's closed forms of their
conjugates, the k = 1 limit, the conjugate's derivative in b, and the checks
of their parameters."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.ot.helpers import fd_grad
from vmoe_sparse_ot import ot

# Jitted once (k and axis static; gamma a pytree leaf): one program per shape.
_conj_simplex = jax.jit(lambda reg, s, b, axis: reg.conj_simplex(s, b, axis), static_argnums=3)
_conj_plus = jax.jit(lambda reg, s, axis: reg.conj_plus(s, axis), static_argnums=2)
REGS = [ot.SparsityConstrained(k=2, gamma=0.3), ot.SquaredL2(0.3), ot.NegEntropy(0.2)]


def test_table1_closed_forms_and_k1_limit():
  rng = np.random.RandomState(0)
  s = rng.randn(7)
  gamma, b = 0.7, 0.4
  # Top-k: gamma/2 sum_{i<=k} 1[u_[i] >= tau] (u_[i]^2 - tau^2), u = s / gamma.
  k = 3
  reg = ot.SparsityConstrained(k=k, gamma=gamma)
  s_col, b_col = jnp.asarray(s[:, None]), jnp.asarray([b])
  val, t, dval = _conj_simplex(reg, s_col, b_col, 0)
  u = np.sort(s / gamma)[::-1][:k]
  tau = float(np.asarray(dval)[0]) / gamma
  np.testing.assert_allclose(np.sum(np.maximum(u - tau, 0)), b, rtol=1e-12)
  expect = 0.5 * gamma * np.sum((u >= tau) * (u ** 2 - tau ** 2))
  np.testing.assert_allclose(float(np.asarray(val)[0]), expect, rtol=1e-12)
  # k = 1 (Proposition 4, limit cases): b max(s) - gamma/2 b^2 and 1/(2 gamma) max [s]_+^2.
  reg1 = ot.SparsityConstrained(k=1, gamma=gamma)
  v1, t1, _ = _conj_simplex(reg1, s_col, b_col, 0)
  np.testing.assert_allclose(float(np.asarray(v1)[0]), b * s.max() - 0.5 * gamma * b * b,
                             rtol=1e-12)
  assert np.asarray(t1)[np.argmax(s), 0] == pytest.approx(b)
  vp, _ = _conj_plus(reg1, s_col, 0)
  np.testing.assert_allclose(float(np.asarray(vp)[0]), max(s.max(), 0) ** 2 / (2 * gamma),
                             rtol=1e-12)
  # Squared L2 and negentropy rows of Table 1.
  vl2, _ = _conj_plus(ot.SquaredL2(gamma), s_col, 0)
  np.testing.assert_allclose(float(np.asarray(vl2)[0]),
                             np.sum(np.maximum(s, 0) ** 2) / (2 * gamma))
  ve, te, _ = _conj_simplex(ot.NegEntropy(gamma), s_col, b_col, 0)
  lse = np.log(np.sum(np.exp(s / gamma)))
  np.testing.assert_allclose(float(np.asarray(ve)[0]),
                             gamma * b * lse - gamma * b * np.log(b), rtol=1e-12)
  np.testing.assert_allclose(np.asarray(te)[:, 0].sum(), b)


@pytest.mark.parametrize("reg", REGS, ids=repr)
def test_conjugate_derivative_in_b(reg):
  rng = np.random.RandomState(2)
  s = jnp.asarray(rng.randn(6, 3))
  b = np.array([0.2, 0.5, 1.3])
  _, _, db = _conj_simplex(reg, s, jnp.asarray(b), 0)
  f = lambda bb: float(np.sum(_conj_simplex(reg, s, jnp.asarray(bb), 0)[0]))
  np.testing.assert_allclose(np.asarray(db), fd_grad(f, b), atol=1e-6)


@pytest.mark.parametrize("ctor,name", [
    (lambda: ot.SparsityConstrained(k=0), "k"),
    (lambda: ot.SparsityConstrained(k=-2), "k"),
    (lambda: ot.SparsityConstrained(k=1.5), "k"),
    (lambda: ot.SparsityConstrained(k=2, gamma=0.0), "gamma"),
    (lambda: ot.SparsityConstrained(k=2, gamma=-1.0), "gamma"),
    (lambda: ot.SquaredL2(gamma=0), "gamma"),
    (lambda: ot.NegEntropy(gamma=float("nan")), "gamma"),
])
def test_regularizers_reject_bad_parameters(ctor, name):
  with pytest.raises(ValueError, match=name):
    ctor()
