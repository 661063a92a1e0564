"""'soft_moe' (nn/routers/soft_moe.py): dispatch and combine weights as the definition
says, its slots per expert and its similarity metrics."""
import numpy as np
import pytest
import jax

from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn import routing as rt
from vmoe_sparse_ot.nn.routers import soft_moe
from tests.nn.helpers import jit_expert_weights, jit_route
from tests.nn.routers.helpers import cfg, softmax


def test_soft_moe_weights_sum_as_the_definition_says():
  g, s, e, c = 2, 5, 3, 2
  logits = np.asarray(jax.random.normal(jax.random.key(2), (g, s, e, c))) * 2
  mask = np.array([[True] * 5, [True, True, True, False, False]])
  r = jit_route(logits, mask, cfg("soft_moe"), c, False)
  assert isinstance(r, rt.SoftRouting)
  d, w = np.asarray(r.dispatch_weight), np.asarray(r.combine_weight)
  # Dispatch: softmax over the group's real tokens, per slot.
  np.testing.assert_allclose(d.sum(axis=1), 1.0, rtol=1e-5)
  assert (d[1, 3:] == 0).all()
  np.testing.assert_allclose(d[1, :3], softmax(logits[1, :3], axis=0), rtol=1e-5)
  np.testing.assert_allclose(d[0], softmax(logits[0], axis=0), rtol=1e-5)
  # Combine: softmax over all E*C slots, per real token; 0 for padding.
  np.testing.assert_allclose(w.sum(axis=(2, 3))[mask], 1.0, rtol=1e-5)
  assert (w[~mask] == 0).all()
  want = softmax(logits.reshape(g, s, e * c)).reshape(g, s, e, c)
  np.testing.assert_allclose(w[mask], want[mask], rtol=1e-5)
  assert float(r.auxiliary_loss) == 0.0
  # Its per-expert weight is the sum over the expert's slots.
  np.testing.assert_allclose(jit_expert_weights(r, s), w.sum(-1), rtol=1e-6)
  # Slots per expert: round(S * capacity_factor / E), or `capacity`.
  soft = routers.ROUTERS["soft_moe"]
  assert soft.capacity(cfg("soft_moe").options, 64, 8) == 8
  assert soft.capacity(cfg("soft_moe", capacity_factor=0.5).options, 50, 4) == 6
  assert soft.capacity(cfg("soft_moe", capacity=1).options, 64, 8) == 1
  # Halves go to the even integer (Python's round, as the reference's): 24.5 -> 24,
  # 3.5 -> 4; below one slot is an error there and here.
  assert soft.capacity(cfg("soft_moe").options, 196, 8) == 24
  assert soft.capacity(cfg("soft_moe").options, 56, 16) == 4
  with pytest.raises(ValueError, match=r"^model.encoder.moe.router.capacity_factor=0.25 gives "
                     r"round\(8 \* 0.25 / 8\) = 0 soft_moe slots per expert"):
    soft.capacity(cfg("soft_moe", capacity_factor=0.25).options, 8, 8)
  assert not soft.needs_rng(cfg("soft_moe").options, True)
  assert soft.needs_rng(cfg("soft_moe", noise_std=0.1).options, True)
  # num_slots, the reference SoftRouter's, sets C whatever capacity_factor is.
  assert soft.capacity(cfg("soft_moe", num_slots=1, capacity_factor=4.0).options, 64, 8) == 1
  with pytest.raises(ValueError, match="^model.encoder.moe.router.soft_moe.num_slots=2 and "
                     r"model.encoder.moe.router.capacity=1 both set"):
    soft.capacity(cfg("soft_moe", num_slots=2, capacity=1).options, 64, 8)
  # Its similarity metrics: cosines between real tokens' combine weights and between
  # slots' dispatch weights, distinct pairs only (here off the same routing).
  metrics = jax.jit(soft_moe.similarity_metrics)(
      r.dispatch_weight, r.combine_weight, mask)
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  tokens = [unit(w[gi][mask[gi]].reshape(-1, e * c)) for gi in range(g)]
  slots = [unit(d[gi].reshape(s, e * c).T) for gi in range(g)]
  for name, rows in (("combine_weights", tokens), ("dispatch_weights", slots)):
    pairs = np.concatenate([(x @ x.T)[~np.eye(len(x), dtype=bool)] for x in rows])
    for stat in ("min", "max", "mean"):
      np.testing.assert_allclose(float(metrics[f"{name}_similarity_{stat}"]),
                                 getattr(pairs, stat)(), rtol=1e-5)
  np.testing.assert_allclose(float(metrics["combine_weights_min_mean"]),
                             w.reshape(g, s, e * c).min(-1)[mask].mean(), rtol=1e-5)

