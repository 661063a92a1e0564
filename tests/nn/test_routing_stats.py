"""nn.routing_stats: per-token routing read back from the sown expert weights, and
the eval-set counts, against hand-computed values."""
import numpy as np
import jax

from vmoe_sparse_ot.nn import routing_stats


def test_layer_weights_are_the_moe_layers_in_block_order():
  w9, w10 = np.full((1, 2, 2), 9.0), np.full((1, 2, 2), 10.0)
  encoder = {"encoderblock_10": {"moe": {"expert_weights": (w10,)}},
             "encoderblock_2": {"mlp": {}},                # a dense block: no weights
             "encoderblock_9": {"moe": {"expert_weights": (w9,)}},
             "encoder_norm": np.zeros(3)}                   # not a block
  for state in ({"intermediates": {"encoder": encoder}}, {"encoder": encoder}):
    out = routing_stats.layer_weights(state)
    assert list(out) == ["encoderblock_9", "encoderblock_10"]   # 9 before 10, not as text
    assert out["encoderblock_9"] is w9 and out["encoderblock_10"] is w10
  assert routing_stats.layer_weights({}) == {}


def test_per_image_undoes_the_grouping_and_drops_the_group_padding():
  # B = 2 images of N = 2 tokens in G = 2 groups of S = 3: the last two slots are padding.
  weights = np.arange(12.0).reshape(2, 3, 2)
  out = routing_stats.per_image(weights, 2, 2)
  np.testing.assert_array_equal(out, [[[0, 1], [2, 3]], [[4, 5], [6, 7]]])


def test_assignments_in_decreasing_weight_ties_to_the_lower_expert():
  weights = np.array([[[0.2, 0.5, 0.2], [0.0, 0.0, 0.0], [0.0, 0.0, 0.7]]], np.float32)
  experts, w = map(np.asarray, jax.jit(routing_stats.assignments)(weights))
  np.testing.assert_array_equal(experts, [[[1, 0, 2], [-1, -1, -1], [2, -1, -1]]])
  np.testing.assert_array_equal(w, np.array([[[0.5, 0.2, 0.2], [0, 0, 0], [0.7, 0, 0]]],
                                            np.float32))
  assert experts.dtype == np.int32 and w.dtype == np.float32


def test_eval_counts_match_training_metrics_and_skip_padded_examples():
  # routing_stats counts from per-token weights (B, N, E) with the same `token_counts`.
  # Image 0: tokens with 2, 1 and 0 experts; image 1 is batch padding (mask False).
  weights = np.array([[[0.5, 0.5], [1.0, 0.0], [0.0, 0.0]],
                      [[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]], np.float32)
  sums = jax.device_get(jax.jit(routing_stats.routing_sums)(weights, np.array([True, False])))
  assert {k: np.asarray(v).tolist() for k, v in sums.items()} == {
      "tokens": 3, "dropped": 1, "with_1": 1, "with_2plus": 1, "expert_tokens": [2, 1]}
  assert routing_stats.summarize(sums) == {
      "num_tokens": 3, "dropped_fraction": 1 / 3, "tokens_with_1_expert": 1 / 3,
      "tokens_with_2plus_experts": 1 / 3, "experts_per_token": 1.0,
      "expert_load": [2 / 3, 1 / 3], "expert_tokens": [2, 1]}
  # No real token at all: fractions 0, not a division by zero.
  empty = routing_stats.summarize({"tokens": 0, "dropped": 0, "with_1": 0, "with_2plus": 0,
                                   "expert_tokens": [0, 0]})
  assert (empty["num_tokens"], empty["dropped_fraction"], empty["expert_load"]) == (0, 0.0,
                                                                                    [0.0, 0.0])
