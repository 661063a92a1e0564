"""evaluate.features: pre-logits features of padded batches, on one device or a mesh."""
import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from tests.evaluate.helpers import LinearModel, batches, image_data
from vmoe_sparse_ot import nn
from vmoe_sparse_ot.evaluate import features


def test_extract_drops_padding_and_matches_direct_apply():
  model = LinearModel()
  images, labels = image_data(0, 21)
  params = model.init(jax.random.key(0), images[:1], False)['params']
  feats, got_labels = features.extract(features.make_feature_fn(model), params,
                                       batches(images, labels, 8))
  assert feats.shape == (21, 6) and feats.dtype == np.float32
  np.testing.assert_array_equal(got_labels, labels)
  _, aux = model.apply({'params': params}, images, train=False)
  np.testing.assert_allclose(feats, aux['pre_logits'], rtol=1e-5, atol=1e-6)


def test_sharded_extraction_of_vmoe_matches_single_device():
  cfg = nn.model_config.default_model_config()
  cfg.hidden_size, cfg.encoder.num_layers, cfg.encoder.mlp_dim = 16, 1, 32
  cfg.encoder.num_heads, cfg.encoder.moe.num_experts, cfg.encoder.moe.group_size = 2, 4, 4
  cfg.encoder.moe.layers = '0'  # the one block is an MoE block
  model = nn.build_model(cfg)
  rng = np.random.default_rng(0)
  images = rng.normal(size=(13, 8, 8, 1)).astype(np.float32)
  labels = rng.integers(0, 10, size=13).astype(np.int32)
  init = jax.jit(lambda key, x: model.init({'params': key}, x, train=False))
  params = init(jax.random.key(0), images[:2])['params']
  padded = batches(images, labels, 8)
  want, want_labels = features.extract(features.make_feature_fn(model), params, padded)
  assert want.shape == (13, 16)
  mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ('data', 'expert'))
  got, got_labels = features.extract(features.make_feature_fn(model, mesh=mesh), params, padded)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(got_labels, want_labels)
  with pytest.raises(ValueError, match='multiple of the number of devices in the mesh, 8'):
    features.extract(features.make_feature_fn(model, mesh=mesh), params,
                     batches(images, labels, 6))
