"""Masked padding in a group never changes how the group's real tokens are routed.

The MoE layer pads its last group with masked tokens (token_mask False) when the
tokens do not fill it. For every router, the real tokens of a padded group must
go to the same experts with the same combine weights as when they are routed
alone (a group of just those tokens, at the same capacity), and the padding must
get no combine or dispatch weight, whatever its logits.
"""
import numpy as np
import pytest
import jax

from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn import routing as rt
from tests.nn.helpers import jit_route

# S tokens per padded group; the real tokens of each group: one with a few padding
# tokens (C binds: tokens are dropped), one mostly padding (fewer real tokens than C,
# so expert-choice buffers keep empty slots).
S, E, C = 16, 4, 4
REAL = (11, 3)
SEEDS = (0, 1, 2)
PADDING = ("zeros", "normal")

# One entry per router, and per option that takes another code path.
CONFIGS = {
    "topk": ("topk", {"num_selected_experts": 2}),
    "topk-batch_priority": ("topk", {"num_selected_experts": 2, "batch_priority": True}),
    "sbase": ("sbase", {"num_selected_experts": 2}),
    "sbase-batch_priority": ("sbase", {"num_selected_experts": 2, "batch_priority": True}),
    "sbase-first_update_tokens": ("sbase", {"num_selected_experts": 1,
                                            "first_update": "tokens"}),
    "sparse_ot-expert_choice": ("sparse_ot", {}),
    "sparse_ot-token_choice": ("sparse_ot", {"form": "token_choice",
                                             "num_selected_experts": 2}),
    "expert_choice": ("expert_choice", {}),
    "soft_moe": ("soft_moe", {}),
    "sinkhorn_ec": ("sinkhorn_ec", {}),
    "topk_bias": ("topk_bias", {"num_selected_experts": 2}),
    "topk_bias-batch_priority": ("topk_bias", {"num_selected_experts": 2,
                                               "batch_priority": True}),
    "l2_ot": ("l2_ot", {}),
    "kl_ot": ("kl_ot", {"num_selected_experts": 2}),
    "kl_ot-expert_choice": ("kl_ot", {"form": "expert_choice"}),
}


def test_every_router_is_checked():
  # A new router module must join CONFIGS (docs/ARCHITECTURE.md, "How to add a router").
  assert {name for name, _ in CONFIGS.values()} == set(routers.ROUTER_MODULES)


_expert_weights = jax.jit(rt.expert_weights, static_argnames="group_size")


def _cfg(key):
  name, options = CONFIGS[key]
  return routers.RouterConfig(name, routers.ROUTERS[name].options(**options))


def _logits_shape(cfg, g, s):
  # Soft MoE's logits are per slot: (G, S, E, C).
  return (g, s, E, C) if cfg.name == "soft_moe" else (g, s, E)


def _state(cfg):
  """A stateful router's state, away from its initial value so that it matters."""
  if routers.ROUTERS[cfg.name].state is None:
    return None
  return {"bias": np.array([0.1, -0.05, 0.0, 0.2], np.float32)}


def _route_and_statistics(cfg, logits, mask, capacity, train=False, rng=None):
  """(routing, a stateful router's statistics or None)."""
  out = jit_route(logits, mask, cfg, capacity, train, rng, _state(cfg))
  return (out, None) if routers.ROUTERS[cfg.name].state is None else out


def _route(cfg, logits, mask, capacity, train=False, rng=None):
  return _route_and_statistics(cfg, logits, mask, capacity, train, rng)[0]


def _per_token(routing, s):
  """(dispatched (G, S, E) bool, combine weight (G, S, E), dispatch weight or None)."""
  if isinstance(routing, rt.SoftRouting):
    dispatch = np.asarray(routing.dispatch_weight)
    return dispatch.sum(-1) > 0, np.asarray(routing.combine_weight), dispatch
  ti, valid = np.asarray(routing.token_index), np.asarray(routing.valid)
  dispatched = np.zeros((ti.shape[0], s, ti.shape[1]), bool)
  for g, e, c in zip(*np.nonzero(valid)):
    dispatched[g, ti[g, e, c], e] = True
  return dispatched, np.asarray(_expert_weights(routing, group_size=s)), None


def _inputs(cfg, seed, padding, real=REAL, s=S):
  """(logits, mask): 2 N(0, 1) logits for the real tokens, then padding at the end."""
  rng = np.random.default_rng(seed)
  logits = 2 * rng.standard_normal(_logits_shape(cfg, len(real), s))
  pad = np.arange(s)[None, :] >= np.asarray(real)[:, None]                  # (G, S)
  fill = 0.0 if padding == "zeros" else 3 * rng.standard_normal(logits.shape)
  logits = np.where(pad.reshape(pad.shape + (1,) * (logits.ndim - 2)), fill, logits)
  return logits.astype(np.float32), ~pad


def _capacity_alone(cfg, n):
  """C for a group of n real tokens routed alone: expert-choice buffers cannot
  exceed the group (the padded group's extra slots must then stay empty)."""
  expert_choice = cfg.name in ("expert_choice", "sinkhorn_ec", "l2_ot") or (
      cfg.name in ("sparse_ot", "kl_ot") and cfg.options.form == "expert_choice")
  return min(C, n) if expert_choice else C


def _assert_padding_gets_nothing(routing, mask):
  dispatched, combine, dispatch = _per_token(routing, mask.shape[1])
  pad = ~mask
  assert not dispatched[pad].any()
  np.testing.assert_array_equal(combine[pad], 0.0)
  if dispatch is not None:
    np.testing.assert_array_equal(dispatch[pad], 0.0)


def _real(per_token, g, n):
  """`_per_token`'s arrays at group g's first n tokens."""
  return tuple(None if x is None else x[g, :n] for x in per_token)


def _assert_same_routing(got, want, where):
  """Same experts, and combine (and dispatch) weights equal up to rounding."""
  np.testing.assert_array_equal(got[0], want[0], err_msg=f"experts, {where}")
  for name, a, b in (("combine", got[1], want[1]), ("dispatch", got[2], want[2])):
    if a is not None:
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7,
                                 err_msg=f"{name} weights, {where}")


@pytest.mark.parametrize("padding", PADDING)
@pytest.mark.parametrize("key", list(CONFIGS))
def test_real_tokens_route_as_without_the_padding(key, padding):
  cfg = _cfg(key)
  for seed in SEEDS:
    logits, mask = _inputs(cfg, seed, padding)
    routing, statistics = _route_and_statistics(cfg, logits, mask, C)
    _assert_padding_gets_nothing(routing, mask)
    padded = _per_token(routing, S)
    losses, loads = [], []
    for g, n in enumerate(REAL):
      alone, alone_statistics = _route_and_statistics(
          cfg, logits[g:g + 1, :n], mask[g:g + 1, :n], _capacity_alone(cfg, n))
      losses.append(float(alone.auxiliary_loss))
      _assert_same_routing(_real(padded, g, n), _real(_per_token(alone, n), 0, n),
                           f"seed {seed}, group {g}")
      if statistics is not None:
        loads.append(np.asarray(alone_statistics["load"]))
    # The routers' losses are per-group means over the groups.
    np.testing.assert_allclose(float(routing.auxiliary_loss), np.mean(losses), rtol=1e-5,
                               atol=1e-8)
    if statistics is not None:   # topk_bias's load counts real tokens only.
      np.testing.assert_array_equal(statistics["load"], np.sum(loads, axis=0))


NOISY = {
    "topk": ("topk", {"num_selected_experts": 2}),
    "expert_choice": ("expert_choice", {}),
    "soft_moe": ("soft_moe", {"noise_std": 0.5}),
    "kl_ot": ("kl_ot", {"num_selected_experts": 2, "load_loss_weight": 0.1}),
}


@pytest.mark.parametrize("key", list(NOISY))
def test_noisy_training_ignores_the_padding_logits(key):
  """In training the noise is drawn for the whole (G, S, E) block, so real tokens
  routed alone get other draws; with the same key and shape, the real tokens'
  routing (and the losses) must not depend on the padding's logits."""
  name, options = NOISY[key]
  cfg = routers.RouterConfig(name, routers.ROUTERS[name].options(**options))
  assert routers.ROUTERS[name].needs_rng(cfg.options, True)
  for seed in SEEDS:
    rng = jax.random.key(seed)
    (zeros, mask), (normal, _) = (_inputs(cfg, seed, p) for p in PADDING)
    a, b = (_route(cfg, x, mask, C, train=True, rng=rng) for x in (zeros, normal))
    _assert_padding_gets_nothing(a, mask)
    _assert_padding_gets_nothing(b, mask)
    for g, n in enumerate(REAL):
      _assert_same_routing(_real(_per_token(a, S), g, n), _real(_per_token(b, S), g, n),
                           f"seed {seed}, group {g}")
    np.testing.assert_allclose(float(a.auxiliary_loss), float(b.auxiliary_loss), rtol=1e-6)


@pytest.mark.parametrize("padding", PADDING)
def test_sbase_the_issues_input(padding):
  """The report's input: 8 real tokens, 2 N(0, 1) logits, E = 4, K = 1, C = 8, routed
  alone and with 24 padding tokens (logits 0 or 3 N(0, 1)), numpy seeds 0 to 19.
  Before padding got no Sinkhorn mass, 65 of these 320 tokens changed experts."""
  cfg = routers.parse_router_options({"name": "sbase", "num_selected_experts": 1,
                                      "capacity": 8})
  mask = np.arange(32)[None] < 8
  for seed in range(20):
    rng = np.random.default_rng(seed)
    logits = 2 * rng.standard_normal((1, 8, 4))
    pad = np.zeros((1, 24, 4)) if padding == "zeros" else 3 * rng.standard_normal((1, 24, 4))
    padded = np.concatenate([logits, pad], axis=1).astype(np.float32)
    with_padding = _route(cfg, padded, mask, 8)
    _assert_padding_gets_nothing(with_padding, mask)
    alone = _route(cfg, logits.astype(np.float32), np.ones((1, 8), bool), 8)
    _assert_same_routing(_real(_per_token(with_padding, 32), 0, 8),
                         _real(_per_token(alone, 8), 0, 8), f"seed {seed}")
