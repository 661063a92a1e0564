"""'expert_choice' (nn/routers/expert_choice.py): the reference's capacity and each
expert's top-C tokens."""
import math

import numpy as np
import pytest

from vmoe_sparse_ot.nn import routers
from tests.nn.helpers import jit_route
from tests.nn.routers.helpers import ALL, LOGITS, cfg, slots, softmax


@pytest.mark.parametrize("s, e, cf, want", [
    (400, 32, 1.05, 16),    # the paper's B/32 groups: ceil(13.125) = 14 -> 16
    (64, 8, 1.0, 8),        # the tiny config's groups: 8, already a multiple of 4
    (50, 4, 0.5, 8),        # ceil(6.25) = 7 -> 8
    (1576, 8, 1.0, 200),    # B/16 groups: 197 -> 200
    (10, 4, 1.0, 4),        # ceil(2.5) = 3 -> 4
    (10, 2, 2.0, 10),       # 10 -> 12, capped at S (the reference would fail in top_k)
])
def test_expert_choice_capacity_is_the_references_compute_capacity(s, e, cf, want):
  """C = ceil(S * capacity_factor / E), rounded up to a multiple of 4; K plays no part."""
  capacity = routers.ROUTERS["expert_choice"].capacity
  by_hand = min(s, 4 * math.ceil(math.ceil(s * cf / e) / 4))
  assert capacity(cfg("expert_choice", capacity_factor=cf).options, s, e) == by_hand == want
  for k in (1, 2, 4):
    assert capacity(cfg("expert_choice", capacity_factor=cf, num_selected_experts=k).options,
                    s, e) == want
  # TopK counts S * K tokens (also the reference's rule for token choice).
  topk_c = routers.ROUTERS["topk"].capacity(
      cfg("topk", capacity_factor=cf, num_selected_experts=2).options, s, e)
  assert topk_c == min(s, 4 * math.ceil(math.ceil(s * 2 * cf / e) / 4))
  assert capacity(cfg("expert_choice", capacity=3).options, s, e) == 3


def test_expert_choice_takes_top_c_tokens_per_expert():
  r = jit_route(LOGITS, ALL, cfg("expert_choice"), capacity=2, train=False)
  gates = softmax(LOGITS[0])
  want = {e: sorted(np.argsort(-gates[:, e], kind="stable")[:2].tolist()) for e in range(3)}
  assert slots(r) == want
  assert float(r.auxiliary_loss) == 0.0
  # A padding token is never taken.
  mask = np.array([[True, True, True, False]])
  r = jit_route(LOGITS, mask, cfg("expert_choice"), capacity=3, train=False)
  assert all(3 not in v for v in slots(r).values())

