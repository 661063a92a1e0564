"""The common routing metrics against hand-computed values on small routings."""
import numpy as np
import jax

from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn import routing as rt
from vmoe_sparse_ot.nn.routing_metrics import max_load_violation
from tests.nn.helpers import jit_common_metrics, jit_route

# G = 2 groups of S = 4; token 3 of group 0 is padding. Inputs are numpy arrays: a jnp
# array made from a list or numpy array compiles a conversion program per shape.
MASK = np.array([[True, True, True, False], [True, True, True, True]])


def _check(m, *, with_0, with_1, with_2plus, per_token, maxvio, load):
  """Counts are over the 7 real tokens; load is (min, mean, max) over (group, expert)."""
  np.testing.assert_allclose(m["tokens_with_0_experts"], with_0 / 7, rtol=1e-6)
  np.testing.assert_allclose(m["dropped_fraction"], with_0 / 7, rtol=1e-6)
  np.testing.assert_allclose(m["tokens_with_1_expert"], with_1 / 7, rtol=1e-6)
  np.testing.assert_allclose(m["tokens_with_2plus_experts"], with_2plus / 7, rtol=1e-6)
  np.testing.assert_allclose(m["experts_per_token"], per_token / 7, rtol=1e-6)
  np.testing.assert_allclose(m["max_load_violation"], maxvio, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose([m["tokens_per_expert_min"], m["tokens_per_expert_mean"],
                              m["tokens_per_expert_max"]], load, rtol=1e-6)


def test_hand_made_routing():
  # E = 2, C = 2. Group 0: expert 0 <- tokens 0, 1; expert 1 <- token 0, one empty slot;
  # token 2 gets nothing. Loads [2, 1]: MaxVio 2 / 1.5 - 1 = 1/3.
  # Group 1: expert 0 <- 1, 2; expert 1 <- 1, 3; token 0 gets nothing. Loads [2, 2]: 0.
  token_index = np.array([[[0, 1], [0, 0]], [[1, 2], [1, 3]]])
  valid = np.array([[[True, True], [True, False]], [[True, True], [True, True]]])
  routing = rt.Routing(token_index, valid, valid.astype(np.float32), np.float32(0), {})
  _check(jit_common_metrics(routing, MASK), with_0=2, with_1=3, with_2plus=2, per_token=7,
         maxvio=(1 / 3 + 0) / 2, load=(1, 7 / 4, 2))


def test_a_padding_token_in_a_slot_does_not_count():
  token_index = np.array([[[3, 0]], [[0, 1]]])             # E = 1, C = 2
  valid = np.ones((2, 1, 2), bool)
  m = jit_common_metrics(rt.Routing(token_index, valid, np.ones((2, 1, 2), np.float32), 0.0, {}),
                     MASK)
  np.testing.assert_allclose(m["tokens_per_expert_min"], 1)
  np.testing.assert_allclose(m["tokens_with_0_experts"], 4 / 7)


def test_topk_routing():
  # E = 3, K = 2, C = 2, no noise (eval).
  # Group 0 (t3 is padding): top-2 of each token: t0 (0, 1), t1 (0, 1), t2 (0, 2).
  # First choices: expert 0 takes t0, t1; t2 is over capacity. Second choices: t0, t1 ->
  # expert 1, t2 -> expert 2. Experts per token 2, 2, 1; loads [2, 2, 1]: MaxVio
  # 2 / (5/3) - 1 = 0.2.
  # Group 1: t0 (2, 1), t1 (1, 2), t2 (2, 0), t3 (0, 1). Firsts: e2 <- t0, t2;
  # e1 <- t1; e0 <- t3. Seconds: t0 -> e1, t1 -> e2 full, t2 -> e0, t3 -> e1 full.
  # Per token 2, 1, 2, 1; loads [2, 2, 2]: MaxVio 0.
  logits = np.array([[[1.0, 0.0, -1.0], [2.0, 0.5, 0.0], [3.0, 0.0, 1.0], [0.5, 0.4, 0.0]],
                     [[0.0, 1.0, 2.0], [0.0, 2.0, 1.0], [1.0, 0.0, 2.0], [2.0, 1.0, 0.0]]],
                    np.float32)
  cfg = routers.parse_router_options({"name": "topk"})
  r = jax.jit(lambda x: routers.route(x, MASK, cfg, capacity=2, train=False))(logits)
  _check(jit_common_metrics(r, MASK), with_0=0, with_1=3, with_2plus=4, per_token=11,
         maxvio=(0.2 + 0) / 2, load=(1, 11 / 6, 2))
  # Without padding, token 3 of group 0 is dropped.
  m = jit_common_metrics(r, np.ones((2, 4), bool))
  np.testing.assert_allclose(m["dropped_fraction"], 1 / 8)


def test_expert_choice_routing():
  # E = 3, C = 1: each expert takes its single highest-gate real token.
  # Group 0: experts 0 and 1 both take t0, expert 2 takes t2; t1 gets nothing (t3 is
  # padding, though it has the largest logits). Group 1: expert e takes t_e; t3 none.
  logits = np.array([[[5.0, 5.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 5.0], [9.0, 9.0, 9.0]],
                     [[5.0, 0.0, 0.0], [0.0, 5.0, 0.0], [0.0, 0.0, 5.0], [1.0, 1.0, 1.0]]],
                    np.float32)
  cfg = routers.parse_router_options({"name": "expert_choice"})
  r = jit_route(logits, MASK, cfg, capacity=1, train=False)
  _check(jit_common_metrics(r, MASK), with_0=2, with_1=4, with_2plus=1, per_token=6,
         maxvio=0.0, load=(1, 1, 1))


def test_soft_moe_every_token_reaches_every_expert():
  cfg = routers.parse_router_options({"name": "soft_moe"})
  logits = jax.random.normal(jax.random.key(0), (2, 4, 3, 2))   # (G, S, E, C)
  r = jit_route(logits, MASK, cfg, capacity=2, train=False)
  # Loads: 3 real tokens per expert in group 0, 4 in group 1.
  _check(jit_common_metrics(r, MASK), with_0=0, with_1=0, with_2plus=7, per_token=21,
         maxvio=0.0, load=(3, 3.5, 4))


def test_max_load_violation_skips_empty_groups():
  load = np.array([[4, 0, 2, 2], [0, 0, 0, 0], [1, 1, 1, 1]])
  np.testing.assert_allclose(jax.jit(max_load_violation)(load), (4 / 2 - 1 + 0) / 2)

