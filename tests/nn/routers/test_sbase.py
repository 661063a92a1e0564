"""'sbase' (nn/routers/sbase.py): Sinkhorn-BASE balances, its plans against numpy's."""
import numpy as np
import pytest
import jax

from vmoe_sparse_ot.nn.routers import sbase
from tests.nn.helpers import jit_common_metrics, jit_route
from tests.nn.routers.helpers import ALL, cfg, numpy_sinkhorn, slots, softmax


# All four tokens prefer expert 0; by decreasing margin l0 - l1: 3, 2.5, 0.5, 0.2.
SKEWED = np.array([[[3.0, 0.0], [2.5, 0.0], [1.0, 0.5], [1.2, 1.0]]], np.float32)


def test_sbase_balances_where_topk_does_not():
  topk = jit_route(SKEWED, ALL, cfg("topk", num_selected_experts=1), capacity=4, train=False)
  assert slots(topk) == {0: [0, 1, 2, 3], 1: []}
  r = jit_route(SKEWED, ALL, cfg("sbase", num_selected_experts=1, num_iters=50), capacity=4,
             train=False)
  # Mass S/E = 2 per expert: the two tokens with the smallest margins move to expert 1
  # (entropic plan: sum_i sigmoid(l_i1 - l_i0 + d) = 2 gives d ~ 1.55).
  assert slots(r) == {0: [0, 1], 1: [2, 3]}
  gates = softmax(SKEWED[0])
  np.testing.assert_allclose(np.asarray(r.combine_weight)[0, 1, :2], gates[[2, 3], 1],
                             rtol=1e-6)
  np.testing.assert_allclose(jit_common_metrics(r, ALL)["experts_per_token"], 1.0)


@pytest.mark.parametrize("first_update", ["experts", "tokens"])
def test_sbase_update_order_matches_a_numpy_sinkhorn(first_update):
  logits = np.asarray(jax.random.normal(jax.random.key(4), (2, 16, 4))) * 4   # peaked
  opts = cfg("sbase", num_iters=5, first_update=first_update)
  mask = np.ones((2, 16), bool)
  plans = np.asarray(jax.jit(lambda x, m: sbase.plans(x, m, opts.options))(logits, mask))
  for g in range(2):
    want = numpy_sinkhorn(logits[g], 1.0, 5, first_update == "experts")
    np.testing.assert_allclose(plans[g], want, rtol=2e-4, atol=1e-6)
  # The last update makes its side exact: token rows for 'experts' first (as OTT).
  exact, approx = (2, 1) if first_update == "experts" else (1, 2)
  target = {2: 1.0, 1: 16 / 4}
  np.testing.assert_allclose(plans.sum(exact), target[exact], rtol=1e-5)
  assert np.abs(plans.sum(approx) - target[approx]).max() > 1e-3
  other = numpy_sinkhorn(logits[0], 1.0, 5, first_update != "experts")
  assert np.abs(plans[0] - other).max() > 1e-3

