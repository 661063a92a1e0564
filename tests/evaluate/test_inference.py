"""`vmoe_sparse_ot.load`: a checkpoint as numpy functions, with eval-time routing overrides."""
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

from tests.evaluate.conftest import EVAL_BATCH
from tests.train.helpers import ROOT
from vmoe_sparse_ot import nn
from vmoe_sparse_ot.initialization import flatten_tree
from vmoe_sparse_ot import checkpoints


def test_import_stays_light_and_load_resolves_lazily():
  code = ('import sys, vmoe_sparse_ot; assert "jax" not in sys.modules, "jax"; '
          'assert "tensorflow" not in sys.modules, "tensorflow"; '
          'assert "load" in dir(vmoe_sparse_ot)')
  proc = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                        timeout=60)
  assert proc.returncode == 0, proc.stderr[-2000:]
  import vmoe_sparse_ot
  from vmoe_sparse_ot import inference
  assert vmoe_sparse_ot.load is inference.load
  with pytest.raises(AttributeError, match="has no attribute 'lod'"):
    vmoe_sparse_ot.lod  # noqa: B018


@pytest.fixture(scope='module')
def reference(workdir, eval_data):
  """model.apply on the restored params, the model built from the checkpoint's own config.

  For the first batch (images 0..63) and the last (images 192..199 and 56 zero
  images, as `load` pads it): {first image: (logits, pre_logits, {layer: expert
  weights (G, S, E)}, {layer: router gates (G, S, E)})}.
  """
  params, meta, _ = checkpoints.restore_params_with_meta(str(workdir))
  model = nn.build_model(ml_collections.ConfigDict(meta['model_config']))
  apply = jax.jit(lambda p, x: model.apply(
      {'params': p}, x, train=False, mutable=['intermediates'],
      capture_intermediates=lambda mdl, _: mdl.name == 'router'))
  softmax = jax.jit(jax.nn.softmax)   # eagerly, each of its ops compiles on its own
  images = eval_data[0]
  last = np.concatenate([images[192:], np.zeros((56, 28, 28, 1), np.float32)])
  out = {}
  for first, batch in ((0, images[:EVAL_BATCH]), (192, last)):
    (logits, aux), state = apply(params, batch)
    encoder = state['intermediates']['encoder']
    out[first] = (np.asarray(logits), np.asarray(aux['pre_logits']),
                  {layer: np.asarray(encoder[layer]['moe']['expert_weights'][0])
                   for layer in encoder},
                  {layer: np.asarray(softmax(encoder[layer]['moe']['router']['__call__'][0]))
                   for layer in encoder})
  return out


def test_predict_features_and_routing_equal_model_apply(eval_data, loaded, reference):
  images = eval_data[0]
  m = loaded()
  assert m.step == 4 and m.image_shape == (28, 28, 1) and m.num_tokens == 17
  assert m.capacity == 16
  out = m.outputs(images)
  assert out['logits'].shape == (200, 10) and out['logits'].dtype == np.float32
  for first, (logits, pre_logits, weights, _) in reference.items():
    n = min(EVAL_BATCH, 200 - first)
    np.testing.assert_allclose(out['logits'][first:first + n], logits[:n], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out['pre_logits'][first:first + n], pre_logits[:n], rtol=1e-5,
                               atol=1e-6)
    assert sorted(weights) == sorted(out['routing']) == ['encoderblock_0', 'encoderblock_1']
    for layer, w in weights.items():                       # (G, S, E) -> (B, N, E)
      w = w.reshape(-1, 4)[:EVAL_BATCH * 17].reshape(EVAL_BATCH, 17, 4)[:n]
      experts = out['routing'][layer]['experts'][first:first + n]
      got = out['routing'][layer]['weights'][first:first + n]
      assert experts.shape == got.shape == (n, 17, 4) and experts.dtype == np.int32
      np.testing.assert_allclose(got.sum(-1), w.sum(-1), rtol=1e-5, atol=1e-7)
      # The listed experts are exactly those with a weight, in decreasing weight.
      dense = np.zeros_like(w)
      b, t, k = np.nonzero(experts >= 0)
      dense[b, t, experts[b, t, k]] = got[b, t, k]
      np.testing.assert_allclose(dense, w, rtol=1e-5, atol=1e-7)
      assert np.all(np.diff(got, axis=-1) <= 0) and np.all(got[experts < 0] == 0)
  # One method at a time; fewer images than a batch. Images 0-2 (tokens 0-50) lie in
  # groups 0-1 (tokens 0-63) with the same tokens as before; image 3 shares group 2
  # with zero images now, so its routing, and its logits, may change.
  np.testing.assert_array_equal(m.predict(images[:5])[:3], out['logits'][:3])
  np.testing.assert_array_equal(m.features(images[:EVAL_BATCH]), out['pre_logits'][:EVAL_BATCH])
  assert m.routing(images[:0])['encoderblock_1']['experts'].shape == (0, 17, 4)


def _dropped(routes):
  """{layer: fraction of tokens with no expert}, counted from `routing()` by brute force."""
  return {layer: float(np.mean(r['experts'][..., 0] < 0)) for layer, r in routes.items()}


def test_lower_capacity_drops_more_tokens(eval_data, loaded):
  images = eval_data[0]
  assert loaded(capacity_factor=0.5).capacity == 8
  full, half = _dropped(loaded().routing(images)), _dropped(
      loaded(capacity_factor=0.5).routing(images))
  for layer in full:
    assert half[layer] > full[layer], (layer, half, full)


def _grouped(routes, layer):
  """{'experts', 'weights'} of `layer` as (G, S, K): B*N = 64*17 = 34 whole groups of 32."""
  return {k: v.reshape(-1, 32, v.shape[-1]) for k, v in routes[layer].items()}


def _first_choice_competitions(gates, routes, capacity):
  """Per (group, expert) that more first-choice tokens want than C: (their gates, kept, ids)."""
  top = np.argmax(gates, -1)                                    # (G, S)
  for g in range(gates.shape[0]):
    for e in range(gates.shape[-1]):
      tokens = np.flatnonzero(top[g] == e)
      if len(tokens) > capacity:
        yield gates[g, tokens, e], np.any(routes['experts'][g, tokens] == e, axis=-1), tokens


def test_batch_priority_keeps_the_highest_gates_among_first_choices(eval_data, loaded, reference):
  """TopK serves every token's first choice before any second choice (`assign_token_choice`);
  within first choices, by position, or with batch_priority by decreasing top gate. So at an
  expert that more first-choice tokens want than it has slots (C), exactly C of them are kept:
  with priority those with the highest gates, without it the first C in position.

  Checked on block 0, whose router gates do not depend on routing (no MoE layer comes
  before it), so the reference run's gates are every setting's."""
  images = eval_data[0][:EVAL_BATCH]
  gates = reference[0][3]['encoderblock_0']                     # (G, S, E)
  prioritized = loaded(capacity_factor=0.5, batch_priority=True)
  c = prioritized.capacity
  routes = _grouped(prioritized.routing(images), 'encoderblock_0')
  # Combine weights are the gates of the experts a token got.
  g, s, k = np.nonzero(routes['experts'] >= 0)
  np.testing.assert_allclose(routes['weights'][g, s, k], gates[g, s, routes['experts'][g, s, k]],
                             rtol=1e-5)
  contests = 0
  for gate, kept, _ in _first_choice_competitions(gates, routes, c):
    contests += 1
    assert kept.sum() == c
    assert gate[kept].min() >= gate[~kept].max() - 1e-6  # (gates recomputed: float slack)
  assert contests >= 5  # The check above is not vacuous.
  in_order = _grouped(loaded(capacity_factor=0.5).routing(images), 'encoderblock_0')
  differ = 0
  for gate, kept, tokens in _first_choice_competitions(gates, in_order, c):
    np.testing.assert_array_equal(kept, np.arange(len(tokens)) < c)
    differ += gate[kept].min() < gate[~kept].max()
  assert differ > 0  # Position order really does keep lower gates somewhere.


def test_sparse_ot_router_on_a_topk_checkpoint(eval_data, loaded):
  images = eval_data[0][:EVAL_BATCH]
  topk, ot = loaded().routing(images), loaded(router='sparse_ot').routing(images)
  assert repr(loaded(router='sparse_ot')).startswith('LoadedModel(vit_moe, router sparse_ot')
  for layer in topk:
    assert not np.array_equal(ot[layer]['experts'], topk[layer]['experts'])
    experts = ot[layer]['experts'].reshape(-1, 32, 4)         # (G, S, K)
    for e in range(4):  # Expert-choice form: no expert takes more than C = 16 per group.
      assert np.all(np.sum(experts == e, axis=(1, 2)) <= 16)


def test_bad_overrides_are_value_errors_naming_the_key(workdir):
  import vmoe_sparse_ot
  with pytest.raises(ValueError, match="capacity_factr=0.5: unknown routing override; valid: "
                     'router, num_selected_experts, capacity_factor, capacity, batch_priority'):
    vmoe_sparse_ot.load(str(workdir), capacity_factr=0.5)
  with pytest.raises(ValueError, match=r'capacity_factor=-1: must be a finite number > 0'):
    vmoe_sparse_ot.load(str(workdir), capacity_factor=-1)
  with pytest.raises(ValueError, match=r"router='nope': unknown router; valid: expert_choice, "):
    vmoe_sparse_ot.load(str(workdir), router='nope')
  with pytest.raises(ValueError, match=r"router='soft_moe': the checkpoint's parameters do not "
                     r'fit .*router/mu: checkpoint <absent>'):
    vmoe_sparse_ot.load(str(workdir), router='soft_moe')
  with pytest.raises(ValueError, match=r'batch_size=0'):
    vmoe_sparse_ot.load(str(workdir), batch_size=0)
  with pytest.raises(FileNotFoundError, match='step 3'):
    vmoe_sparse_ot.load(str(workdir), step=3)
  with pytest.raises(ValueError, match=r'images must be float32 \(B, 28, 28, 1\)'):
    vmoe_sparse_ot.load(str(workdir)).predict(np.zeros((2, 8, 8, 1)))


def test_load_checkpoint_without_workdir_equals_the_workdir_model(released, eval_data, loaded,
                                                                  tmp_path):
  """`load(checkpoint=, config=)` of the workdir's weights written as a reference
  partitioned checkpoint: predict, features and routing equal those of `load(workdir)`
  (two readers, two namings, one model)."""
  import vmoe_sparse_ot
  from tests.evaluate.conftest import CONFIG_TEXT, tiny_config
  prefix = released[0]
  config = tmp_path / 'tiny.py'
  config.write_text(CONFIG_TEXT)
  m = vmoe_sparse_ot.load(checkpoint=prefix, config=str(config), batch_size=EVAL_BATCH,
                          capacity_factor=0.5)
  assert (m.step, m.image_shape, m.meta['checkpoint']) == (None, (28, 28, 1), prefix)
  images = eval_data[0][:EVAL_BATCH + 8]   # Two batches, the last one padded.
  ours, theirs = m.outputs(images), loaded(capacity_factor=0.5).outputs(images)
  np.testing.assert_allclose(ours['logits'], theirs['logits'], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(ours['pre_logits'], theirs['pre_logits'], rtol=1e-6, atol=1e-6)
  assert list(ours['routing']) == list(theirs['routing']) == ['encoderblock_0', 'encoderblock_1']
  for layer in ours['routing']:
    np.testing.assert_array_equal(ours['routing'][layer]['experts'],
                                  theirs['routing'][layer]['experts'])
  flat = {k: np.asarray(v) for k, v in flatten_tree(m.params).items()}
  assert sorted(flat) == sorted(released[1])
  for name, value in released[1].items():
    np.testing.assert_array_equal(flat[name], value)
  with pytest.raises(ValueError, match=r"checkpoint=.*: needs config="):
    vmoe_sparse_ot.load(checkpoint=prefix)
  with pytest.raises(ValueError, match=r'exactly one of workdir and checkpoint'):
    vmoe_sparse_ot.load('w', checkpoint=prefix, config=tiny_config())
  with pytest.raises(ValueError, match=r'checkpoint: .*/nope does not exist'):
    vmoe_sparse_ot.load(checkpoint=str(tmp_path / 'nope'), config=tiny_config())
