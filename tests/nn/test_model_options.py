"""nn.model_options: each model option defined once; the defaults, keys, checks and
build_model's arguments derived from it."""
import math

import pytest

from vmoe_sparse_ot import nn as vnn
from vmoe_sparse_ot.config import validation
from vmoe_sparse_ot.config.schema import base_config
from vmoe_sparse_ot.nn import model_options as mo
from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn import variants

def _node(config, path):
  for key in path:
    config = config[key]
  return config


def test_missing_keys_take_the_defaults_and_float_options_are_floats():
  opts = mo.model_options({"head_bias_init": -6, "encoder": {"dropout_rate": 0}})
  assert opts.head_bias_init == -6.0 and isinstance(opts.head_bias_init, float)
  assert isinstance(opts.encoder.dropout_rate, float)
  assert opts.encoder.moe == mo.MoeOptions()                  # router: topk's defaults
  assert opts.encoder.moe.router == routers.RouterConfig("topk")
  # A dense 'vit' never reads encoder.moe: neither its keys nor its values.
  vit = mo.model_options({"name": "vit", "encoder": {"moe": {"num_experts": 0, "x": 1}}})
  assert vit.encoder.moe == mo.MoeOptions()


@pytest.mark.parametrize("check, value, allowed", [
    (mo.integer(1), 0, "must be an integer >= 1"),
    (mo.integer(1), 2.0, "must be an integer"),
    (mo.integer(1), True, "must be an integer"),
    (mo.integer(0, optional=True), -1, "must be an integer >= 0 or None"),
    (mo.integer(0, optional=True), None, None),
    (mo.rate(), 1.0, "must be in [0, 1)"),
    (mo.rate(), math.nan, "must be a finite number in [0, 1)"),
    (mo.rate(), 0.0, None),
    (mo.rate(optional=True, allowed="must be X"), "0.1", "must be X"),
    (mo.finite_number, math.inf, "must be a finite number"),
    (mo.one_of(("a", "b"), optional=True), "c", "must be one of ['a', 'b'] or None"),
    (mo.flag, 1, "must be True or False"),
    (mo.variant, "V-MoE-Ti/16", variants.ALLOWED),   # its words: tests/nn/test_variants.py
    (mo.variant, "V-MoE-S/32", None),
])
def test_checks_word_what_the_value_must_be(check, value, allowed):
  assert check(value) == allowed


@pytest.mark.parametrize("key, value, allowed", [
    ("hidden_size", 0, "must be an integer >= 1"),
    ("representation_size", -1, "must be an integer >= 0 or None"),
    ("head_bias_init", "x", "must be a finite number"),
    ("encoder.num_layers", 0, "must be an integer >= 1"),
    ("encoder.dropout_rate", 1.5, "must be in [0, 1)"),
    ("encoder.moe.num_experts", 0, "must be an integer >= 1"),
    ("encoder.moe.dispatcher", "loop", "must be one of ['dropless', 'einsum', 'indices']"),
    ("encoder.moe.num_shared_experts", -1, "must be an integer >= 0"),
])
def test_one_check_each_worded_by_build_model_and_by_config_validation(key, value, allowed):
  """build_model and config validation run the same check: the same key and allowed
  values, each in its own form of the line."""
  config = base_config().to_dict()
  *path, leaf = key.split(".")
  _node(config["model"], path)[leaf] = value
  with pytest.raises(vnn.OptionError) as e:
    vnn.build_model(config["model"])
  assert str(e.value) == f"model.{key} {allowed}, got {value!r}"
  with pytest.raises(validation.ConfigError) as e:
    validation.validate(config)
  assert str(e.value) == f"config.model.{key}={value!r}: {allowed}"
