"""'sinkhorn_ec': each expert takes (at most C of) its top-C tokens of the Sinkhorn plan."""
import numpy as np
import pytest
import jax
import jax.numpy as jnp

from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn.routers import sinkhorn_ec
from tests.nn.routers.helpers import numpy_sinkhorn

G, S, E = 3, 8, 4


def _cfg(**section):
  return routers.parse_router_options({"name": "sinkhorn_ec", "sinkhorn_ec": section})


def test_each_expert_takes_its_top_c_tokens_of_the_plan():
  logits = np.asarray(jax.random.normal(jax.random.key(0), (G, S, E))) * 2
  mask = np.ones((G, S), bool)
  mask[2, 5:] = False                     # padding in the last group
  cfg = _cfg(num_iters=7)
  capacity = 3
  r = jax.jit(lambda x: routers.route(x, jnp.asarray(mask), cfg, capacity, False))(logits)
  gates = np.asarray(jax.nn.softmax(logits, axis=-1))
  token_index, valid = np.asarray(r.token_index), np.asarray(r.valid)
  for g in range(G):
    plan = numpy_sinkhorn(logits[g], 1.0, 7, mask=mask[g])
    real = np.flatnonzero(mask[g])
    for e in range(E):
      taken = token_index[g, e][valid[g, e]]
      assert len(taken) <= capacity and len(set(taken)) == len(taken)
      # Brute force: the min(C, real tokens) real tokens with the largest plan entries.
      want = real[np.argsort(-plan[real, e], kind="stable")[:min(capacity, len(real))]]
      assert set(taken) == set(want), (g, e)
      np.testing.assert_allclose(r.combine_weight[g, e][valid[g, e]], gates[g, taken, e],
                                 rtol=1e-6)
  assert np.all(np.asarray(r.combine_weight)[~valid] == 0)


def test_plans_match_a_numpy_sinkhorn_and_padding_gets_no_mass():
  logits = np.asarray(jax.random.normal(jax.random.key(1), (2, S, E))) * 3
  mask = np.ones((2, S), bool)
  mask[1, 6:] = False
  opts = _cfg(num_iters=5, epsilon=0.5).options
  plans = np.asarray(jax.jit(lambda x, m: sinkhorn_ec.plans(x, m, opts))(logits, mask))
  for g in range(2):
    np.testing.assert_allclose(plans[g], numpy_sinkhorn(logits[g], 0.5, 5, mask=mask[g]),
                               rtol=2e-4, atol=1e-6)
  np.testing.assert_array_equal(plans[1, 6:], 0.0)
  np.testing.assert_allclose(plans[1].sum(1)[:6], 1.0, rtol=1e-5)   # token rows exact


def test_capacity_as_expert_choice_and_finite_gradients():
  router = routers.get_router("sinkhorn_ec")
  opts = _cfg().options
  assert router.capacity(opts, 16, 4) == 4                       # ceil(16 / 4) -> 4
  assert router.capacity(opts, 16, 8) == 4                       # 2 -> a multiple of 4
  assert router.capacity(routers.parse_router_options(
      {"name": "sinkhorn_ec", "capacity_factor": 2.0}).options, 16, 4) == 8
  logits = jax.random.normal(jax.random.key(2), (2, S, E))
  target = jax.random.normal(jax.random.key(3), (2, E, 2))

  def loss(x):
    r = router.route(x, jnp.ones((2, S), bool), opts, 2, True, None)
    return jnp.sum(r.combine_weight * target)

  grad = jax.jit(jax.grad(loss))(logits)
  assert np.all(np.isfinite(grad)) and np.any(grad != 0)


def test_bad_options_name_the_key():
  with pytest.raises(ValueError, match=r"router.sinkhorn_ec.epsilon must be > 0"):
    _cfg(epsilon=0.0)
  with pytest.raises(ValueError, match=r"router.sinkhorn_ec.first_update must be one of"):
    _cfg(first_update="rows")
  with pytest.raises(ValueError, match=r"router.sinkhorn_ec.num_iters must be an integer >= 1"):
    _cfg(num_iters=0)
