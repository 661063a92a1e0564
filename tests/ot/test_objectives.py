"""objectives: the warm-started semi-dual evaluation is the cold one."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.ot.helpers import problem
from vmoe_sparse_ot import ot
from vmoe_sparse_ot.ot import objectives
from vmoe_sparse_ot.ot import projections


@pytest.mark.parametrize("n", [10, 40])              # (n, m) and (m, n) layouts
@pytest.mark.parametrize("reg", [ot.SquaredL2(1.0), ot.SparsityConstrained(k=5, gamma=1.0)],
                         ids=["l2", "k5"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_warm_started_evaluations_equal_cold_ones_along_a_path(dtype, reg, n, monkeypatch):
  """Along an ascent path (each evaluation started from the previous one's
  thresholds, as inside the solvers), values and gradients equal cold
  evaluations, also where alpha is shifted far below or above the start's
  thresholds; on the radix path (forced for k = 5) the path has evaluations
  where k binds on some column and evaluations where it binds on none."""
  monkeypatch.setattr(projections, "_RADIX_MIN_K", {4: 1, 8: 1})
  m = 300
  a, b, C = (jnp.asarray(v, dtype) for v in problem(m, n, seed=3, uniform=False))
  cold = jax.jit(lambda al: objectives.semi_dual_value_and_grad(al, a, b, C, reg)[:2])
  warm = jax.jit(lambda al, st: objectives.semi_dual_warm(al, st, a, b, C, reg))
  alpha, start = jnp.zeros(m, dtype), None
  rtol = 1e-12 if dtype == jnp.float64 else 1e-5
  binding = []
  for step in range(12):
    value, grad, plan, start = warm(alpha, start)
    want_value, want_grad = cold(alpha)
    np.testing.assert_allclose(value, want_value, rtol=rtol)
    np.testing.assert_allclose(grad, want_grad, rtol=rtol, atol=rtol * float(jnp.max(a)))
    binding.append(bool(jnp.any(jnp.sum(plan > 0, axis=0) == reg.k))
                   if isinstance(reg, ot.SparsityConstrained) else False)
    # Ascent steps, and shifts of alpha that put every entry below the last
    # thresholds (nothing above the start) or far above them.
    alpha = alpha + (2.0 * m) * grad + (-3.0, 3.0, 0.0)[step % 3]
  if isinstance(reg, ot.SparsityConstrained):
    assert any(binding) and not all(binding)
