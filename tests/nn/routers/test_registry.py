"""nn/routers/__init__.py: the registry, option parsing and the default router config."""
import dataclasses

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from vmoe_sparse_ot import nn as vnn
from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn.model_config import default_router_config
from vmoe_sparse_ot.nn.routers import base
from tests.nn.helpers import tiny_config


def test_options_parsing_errors_name_the_full_key():
  with pytest.raises(ValueError, match=r"router.name must be one of .*expert_choice.*sbase"
                     r".*soft_moe.*sparse_ot.*topk"):
    routers.parse_router_options({"name": "hash"})
  with pytest.raises(ValueError, match=r"\['top_k'\].*valid keys.*num_selected_experts"):
    routers.parse_router_options({"name": "topk", "top_k": 2})
  with pytest.raises(ValueError, match=r"model.encoder.moe.router.sparse_ot.solver must be "
                     r"one of \['newton', 'adam', 'lbfgs'\], got 'sgd'"):
    routers.parse_router_options({"name": "sparse_ot", "sparse_ot": {"solver": "sgd"}})
  with pytest.raises(ValueError, match=r"\['iters'\] in model.encoder.moe.router.sbase.*"
                     r"epsilon.*num_iters"):
    routers.parse_router_options({"name": "sbase", "sbase": {"iters": 3}})
  with pytest.raises(ValueError, match=r"model.encoder.moe.router.sparse_ot.num_steps must be "
                     r"an integer >= 1 or None, got 0"):
    routers.parse_router_options({"name": "sparse_ot", "sparse_ot": {"num_steps": 0}})
  with pytest.raises(ValueError, match=r"model.encoder.moe.router.num_selected_experts must "
                     r"be an integer >= 1, got 'two'"):
    routers.parse_router_options({"name": "topk", "num_selected_experts": "two"})
  with pytest.raises(ValueError, match=r"router.capacity_factor must be > 0"):
    routers.parse_router_options({"name": "sbase", "capacity_factor": 0.0})
  with pytest.raises(ValueError) as err:
    routers.parse_router_options({"name": "sparse_ot", "sparse_ot": {"implementation": "gpu"}})
  assert str(err.value) == ("model.encoder.moe.router.sparse_ot.implementation must be one of "
                            "['auto', 'fast', 'candidates', 'reference', 'pallas'], got 'gpu'")


def test_default_config_round_trips_and_is_derived_from_the_dataclasses():
  config = default_router_config()
  for name, router in routers.ROUTERS.items():
    config.name = name
    parsed = routers.parse_router_options(config)
    assert parsed == routers.RouterConfig(name, router.options())
  # Keys users pass today keep working (top level and per-router sections).
  parsed = routers.parse_router_options({
      "name": "sparse_ot", "num_selected_experts": 1, "capacity_factor": 1.5,
      "noise_std": 0.1, "importance_loss_weight": 0.0,
      "sparse_ot": {"num_steps": 7, "learning_rate": 0.1, "gamma": 2.0, "form": "token_choice",
                    "implementation": "reference", "solver": "adam"},
      "sbase": {"epsilon": 0.5, "num_iters": 3}})
  assert parsed.options == routers.ROUTERS["sparse_ot"].options(
      num_selected_experts=1, capacity_factor=1.5, num_steps=7, learning_rate=0.1, gamma=2.0,
      form="token_choice", implementation="reference", solver="adam")


def test_a_new_router_is_one_registration():
  """A plug-in router (every token to its best expert, fixed weight 1) works end to end."""

  @dataclasses.dataclass(frozen=True)
  class Options(base.CommonOptions):
    weight: float = base.option(1.0, "combine weight", check=base.POSITIVE)

  def route(logits, token_mask, opts, capacity, train, rng):
    token_index, valid = base.assign_top_k(logits, token_mask, logits.shape[-1], 1, capacity,
                                           False)
    return base.finish(jnp.full(logits.shape, opts.weight), token_index, valid,
                       base.zero_loss())

  routers.register(base.Router(name="argmax_test", options=Options, route=route))
  try:
    assert default_router_config().argmax_test.weight == 1.0
    model = vnn.build_model(tiny_config("argmax_test", **{"argmax_test.weight": 0.5}))
    images = jax.random.normal(jax.random.key(0), (2, 8, 8, 3))
    params = jax.jit(model.init)(jax.random.key(1), images)["params"]
    _, state = jax.jit(lambda p, x: model.apply({"params": p}, x, mutable=["intermediates"]))(
        params, images)
    w = state["intermediates"]["encoder"]["encoderblock_1"]["moe"]["expert_weights"][0]
    assert set(np.unique(np.asarray(w)).tolist()) <= {0.0, 0.5}
    with pytest.raises(ValueError, match="already registered"):
      routers.register(base.Router(name="argmax_test", options=Options, route=route))
  finally:
    del routers.ROUTERS["argmax_test"]

