"""Slot assignment and capacity, checked against naive Python loops."""
import math

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from vmoe_sparse_ot.nn import routing as rt
from tests.nn.helpers import jit_expert_weights


@pytest.mark.parametrize("s,e,k,cf,expected", [
    (64, 8, 2, 1.0, 16),      # 64*2/8 = 16, already a multiple of 4
    (50, 8, 2, 1.0, 16),      # ceil(12.5) = 13 -> 16
    (64, 8, 1, 1.25, 12),     # 10 -> 12
    (10, 2, 2, 1.0, 10),      # 10 -> 12, capped at S
    (16, 32, 1, 1.0, 4),      # 0.5 -> 1 -> 4
])
def test_compute_capacity(s, e, k, cf, expected):
  assert rt.compute_capacity(s, e, k, cf) == expected


def reference_capacity(num_tokens, num_experts, capacity_factor, ceil_or_round, multiple_of):
  """The reference V-MoE's `compute_capacity` (vmoe/moe.py), written out from its definition."""
  x = num_tokens * capacity_factor / num_experts
  c = math.ceil(x) if ceil_or_round == "ceil" else round(x)   # round: halves to even
  assert c >= 1
  if multiple_of:
    c += (-c) % multiple_of
  return c


@pytest.mark.parametrize("s,e,k,cf,how,mult,expected", [
    (50, 8, 2, 1.0, "ceil", 4, 16),     # 12.5: ceil 13 -> 16
    (50, 8, 2, 1.0, "round", 4, 12),    # 12.5: round to even 12, already a multiple of 4
    (50, 8, 2, 1.0, "ceil", 1, 13),
    (50, 8, 2, 1.0, "round", 1, 12),
    (50, 8, 2, 1.0, "round", 0, 12),    # 0: no rounding up, as the reference's None / 0
    (54, 8, 2, 1.0, "round", 1, 14),    # 13.5: halves to even 14
    (64, 8, 1, 1.05, "ceil", 1, 9),     # 8.4 -> 9
    (64, 8, 1, 1.05, "round", 1, 8),    # 8.4 -> 8
    (64, 8, 1, 1.05, "round", 3, 9),
    (400, 32, 2, 1.05, "round", 4, 28),  # 26.25 -> 26 -> 28; ceil: 27 -> 28
    (10, 2, 2, 1.0, "round", 1, 10),    # 10, capped at S
    (10, 2, 2, 2.0, "ceil", 1, 10),     # 20, capped at S (the reference leaves 20)
])
def test_compute_capacity_ceil_or_round_and_multiple_of(s, e, k, cf, how, mult, expected):
  got = rt.compute_capacity(s, e, k, cf, ceil_or_round=how, multiple_of=mult)
  assert got == min(s, reference_capacity(s * k, e, cf, how, mult)) == expected


def test_compute_capacity_round_to_zero_is_an_error():
  # 16 * 1 * 0.1 / 8 = 0.2: round gives 0 slots (the reference raises too); ceil gives 1.
  with pytest.raises(ValueError, match=r"capacity_factor=0.1 gives C = round\(16 \* 0.1 / 8\) = 0"):
    rt.compute_capacity(16, 8, 1, 0.1, ceil_or_round="round", multiple_of=1)
  assert rt.compute_capacity(16, 8, 1, 0.1, multiple_of=1) == 1


def test_compute_capacity_explicit_and_errors():
  assert rt.compute_capacity(64, 8, 2, 1.0, capacity=7) == 7
  assert rt.compute_capacity(6, 8, 2, 1.0, capacity=7) == 6
  with pytest.raises(ValueError, match="capacity"):
    rt.compute_capacity(64, 8, 2, 1.0, capacity=0)
  with pytest.raises(ValueError, match="capacity_factor"):
    rt.compute_capacity(64, 8, 2, 0.0)


def naive_token_choice(expert_index, token_mask, e, c, priority=None, choice_mask=None):
  """V-MoE Algorithm 1, one token at a time: first choices of all tokens, then seconds."""
  g, s, k = expert_index.shape
  slots = [[[] for _ in range(e)] for _ in range(g)]
  for gi in range(g):
    order = range(s) if priority is None else sorted(range(s), key=lambda t: -priority[gi, t])
    for ki in range(k):
      for t in order:
        if not token_mask[gi, t] or (choice_mask is not None and not choice_mask[gi, t, ki]):
          continue
        ex = expert_index[gi, t, ki]
        if len(slots[gi][ex]) < c:
          slots[gi][ex].append(t)
  return slots


def check_slots(token_index, valid, slots):
  token_index, valid = np.asarray(token_index), np.asarray(valid)
  g, e, c = token_index.shape
  for gi in range(g):
    for ei in range(e):
      n = len(slots[gi][ei])
      assert valid[gi, ei, :n].all() and not valid[gi, ei, n:].any()
      np.testing.assert_array_equal(token_index[gi, ei, :n], slots[gi][ei])


@pytest.mark.parametrize("use_priority,use_choice_mask", [(False, False), (True, False),
                                                          (False, True)])
def test_assign_token_choice_matches_naive_loop(use_priority, use_choice_mask):
  rng = np.random.default_rng(0)
  g, s, e, k, c = 3, 24, 4, 2, 5
  # Distinct experts per token, skewed towards expert 0 so capacity binds.
  scores = rng.normal(size=(g, s, e)) + np.array([2.0, 0.5, 0.0, 0.0])
  expert_index = np.argsort(-scores, axis=-1)[..., :k].astype(np.int32)
  token_mask = np.ones((g, s), bool)
  token_mask[-1, -7:] = False                         # padding in the last group
  priority = rng.uniform(size=(g, s)) if use_priority else None
  choice_mask = rng.uniform(size=(g, s, k)) > 0.3 if use_choice_mask else None
  token_index, valid = jax.jit(rt.assign_token_choice, static_argnums=(2, 3))(
      jnp.asarray(expert_index), jnp.asarray(token_mask), e, c,
      None if priority is None else jnp.asarray(priority),
      None if choice_mask is None else jnp.asarray(choice_mask))
  slots = naive_token_choice(expert_index, token_mask, e, c, priority, choice_mask)
  check_slots(token_index, valid, slots)
  assert np.asarray(valid).sum(-1).max() <= c
  assert max(len(x) for sl in slots for x in sl) == c   # capacity did bind


def test_assign_expert_choice_top_c_tokens():
  scores = jnp.array([[[0.9, 0.1], [0.2, 0.8], [0.5, 0.5], [0.7, 0.0]]])  # (1, S=4, E=2)
  mask = jnp.array([[True, True, True, False]])
  token_index, valid = rt.assign_expert_choice(scores, mask, 2)
  # Expert 0: tokens 0 (0.9) then 2 (0.5); token 3 (0.7) is padding.
  np.testing.assert_array_equal(token_index[0, 0], [0, 2])
  np.testing.assert_array_equal(token_index[0, 1], [1, 2])
  assert valid.all()
  # With a support threshold, zero entries are not taken.
  plan = jnp.array([[[0.9, 0.0], [0.0, 0.8], [0.1, 0.0], [0.0, 0.0]]])
  token_index, valid = rt.assign_expert_choice(plan, jnp.ones((1, 4), bool), 2, min_score=0.0)
  np.testing.assert_array_equal(valid[0], [[True, True], [True, False]])
  np.testing.assert_array_equal(token_index[0, 0], [0, 2])
  assert token_index[0, 1, 0] == 1


def test_expert_weights_of_a_sparse_routing():
  # G=1, S=3, E=2, C=2: expert 0 holds tokens 2, 0; expert 1 holds token 2 and an empty slot.
  r = rt.Routing(np.array([[[2, 0], [2, 0]]], np.int32),
                 np.array([[[True, True], [True, False]]]),
                 np.array([[[0.25, 0.5], [0.75, 0.0]]], np.float32), np.zeros((), np.float32), {})
  np.testing.assert_array_equal(jit_expert_weights(r, 3),
                                [[[0.5, 0.0], [0.0, 0.0], [0.25, 0.75]]])
