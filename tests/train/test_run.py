"""train.run: what `build` shares between runs (programs kept under what they close
over), the encoder's tokens per image, and batch sizes the devices do not divide.

Building compiles nothing (the programs compile on their first call); these tests
call none of them.
"""
import dataclasses
import types

import jax
import pytest

from vmoe_sparse_ot import nn
from vmoe_sparse_ot.train import run as run_lib
from tests.train.helpers import small_config

DEVICES = jax.devices()[:1]
# empty_metrics and flops_per_step are each run's own functions: they look their
# programs up by the run's key when called (which traces or lowers the train step),
# so they are left out here.
NAMES = [f.name for f in dataclasses.fields(run_lib.Programs)
         if f.name not in ('empty_metrics', 'flops_per_step')]


def _build(**overrides):
  config = small_config(**overrides)
  return run_lib.build(config, nn.build_model(config.model), DEVICES)


def _shared(a, b):
  return {name for name in NAMES if getattr(a.programs, name) is getattr(b.programs, name)}


def test_runs_over_seeds_share_every_program_and_another_peak_value_only_the_model_s():
  first = _build()
  other_seed = _build(seed=1)
  assert _shared(first, other_seed) == set(NAMES)
  assert not other_seed.compiles                  # its train step is the first run's
  assert not (first.init_key == other_seed.init_key).all()   # the seed's own keys
  # Another learning rate: another optimizer, so another state and step; the same
  # model variables, evaluation and finiteness check.
  other_lr = _build(schedule__peak_value=1e-2)
  assert _shared(first, other_lr) == {'init_variables', 'eval_step', 'all_finite'}


def test_tokens_per_image_counts_patches_and_the_class_token():
  model = nn.build_model(small_config().model)    # 28x28 images, 7x7 patches, token
  assert (model.patch_size, model.classifier) == ((7, 7), 'token')
  assert run_lib.tokens_per_image(model, 28) == 4 * 4 + 1
  gap = types.SimpleNamespace(moe_layers=(1,), patch_size=(4, 2), classifier='gap')
  assert run_lib.tokens_per_image(gap, 8) == 2 * 4
  dense = types.SimpleNamespace(moe_layers=(), patch_size=(4, 4), classifier='token')
  assert run_lib.tokens_per_image(dense, 8) is None


@pytest.mark.parametrize('key, value', [('batch_size', 33), ('eval_batch_size', 9)])
def test_a_batch_size_the_devices_do_not_divide_is_named(key, value):
  config = small_config(**{key: value})
  with pytest.raises(ValueError) as e:
    run_lib.build(config, nn.build_model(config.model), jax.devices()[:2])
  assert str(e.value) == (f'config.{key}={value} must be a multiple of the number of devices '
                          '(2) and of processes (1)')
