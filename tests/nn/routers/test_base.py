"""nn/routers/base.py, what every router shares: gate noise of std noise_std / E and
the capacity rule (`default_capacity`), across the routers that use them."""
import math

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn import routing as rt
from vmoe_sparse_ot.nn.model_config import default_router_config
from vmoe_sparse_ot.nn.routers import base
from tests.nn.routers.helpers import cfg


@pytest.mark.parametrize("router, noise_std", [("topk", 1.0), ("expert_choice", 2.0)])
def test_gate_noise_std_is_noise_std_over_e(router, noise_std):
  """The reference's formula: logits + (noise_std / E) * N(0, 1), over many draws.

  With zero logits, every token sent to all E experts (TopK with K = E, or
  expert choice with C = S) and C = S, the combine weights are the noisy
  softmax itself; its log, centered over the experts, is the noise minus its
  mean over the E experts, of variance (noise_std / E)^2 (E - 1) / E.
  """
  s, e = 2048, 4                        # 8192 draws
  opts = cfg(router, num_selected_experts=e, noise_std=noise_std)
  gates = jax.jit(lambda x: rt.expert_weights(routers.route(
      x, jnp.ones((1, s), bool), opts, capacity=s, train=True, rng=jax.random.key(0)), s))(
          np.zeros((1, s, e), np.float32))      # jit: one compile, cheaper than eager ops
  log_gates = np.log(np.asarray(gates))                                # (1, S, E)
  centered = log_gates - log_gates.mean(-1, keepdims=True)
  want = (noise_std / e) ** 2 * (e - 1) / e         # 1.0: (1/4)^2 * 3/4 = 0.046875
  np.testing.assert_allclose(np.mean(centered ** 2), want, rtol=0.06)
  # Read as the std itself (noise_std=1.0 -> std 1) the variance would be E^2 larger.
  assert np.mean(centered ** 2) < 2 * want < noise_std ** 2 * (e - 1) / e
  assert routers.ROUTERS[router].needs_rng(opts.options, True)
  assert not routers.ROUTERS[router].needs_rng(cfg(router, noise_std=0.0).options, True)
  assert not routers.ROUTERS[router].needs_rng(opts.options, False)


def test_noise_std_defaults_to_the_references_one_over_e():
  for name in ("topk", "expert_choice"):
    assert routers.ROUTERS[name].options().noise_std == 1.0
  assert default_router_config().noise_std == 1.0
  # A ported config's noise_std=1.0 and the default both mean std 1/E; None too
  # (configs saved before the key had a number).
  assert base.gate_noise_std(1.0, 8) == base.gate_noise_std(None, 8) == 0.125
  assert base.gate_noise_std(2.0, 32) == 1 / 16


@pytest.mark.parametrize("name, counts_k", [
    ("topk", True), ("sbase", True), ("topk_bias", True), ("sparse_ot", True),
    ("expert_choice", False), ("sinkhorn_ec", False)])
def test_every_capacity_factor_router_reads_ceil_or_round_and_multiple_of(name, counts_k):
  """S 50, E 8, f 1: S*K*f/E = 12.5 (K 2) or 6.25 (per expert); the reference's rule."""
  s, e, k = 50, 8, 2
  tokens = s * k if counts_k else s
  for how, mult in (("ceil", 4), ("round", 4), ("ceil", 1), ("round", 1)):
    x = tokens * 1.0 / e
    want = math.ceil(x) if how == "ceil" else round(x)
    want += (-want) % mult
    options = cfg(name, capacity_factor=1.0, num_selected_experts=k,
                  capacity_ceil_or_round=how, capacity_multiple_of=mult).options
    assert routers.ROUTERS[name].capacity(options, s, e) == want, (how, mult)

