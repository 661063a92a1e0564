"""Config files in the reference V-MoE layout, translated (vmoe_sparse_ot/config/reference.py).

The config files under tests/config/reference_configs/ are written for these tests
from the reference layout's documentation; expectations are written out by hand.
"""
import json
import math
import os
import re
import shutil
import subprocess

import ml_collections
import numpy as np
import pytest

from tests import main_cases
from vmoe_sparse_ot.config import files
from vmoe_sparse_ot.config import reference
from vmoe_sparse_ot.train import optimizer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
S32 = os.path.join(HERE, 'reference_configs', 's32_ilsvrc2012.py')
B16_FT = os.path.join(HERE, 'reference_configs', 'b16_ft_cifar10.py')
EEE = os.path.join(HERE, 'reference_configs', 'eee_s32_ft_cifar100.py')
# A made-up size of imagenet2012's train[:99%], for train_epochs.
TRAIN_EXAMPLES = 1_268_355


def _s32():
  return files.load_config_file(S32, translate=False)


def _translate(config, examples=TRAIN_EXAMPLES):
  return reference.translate(config, num_examples=lambda name, split, data_dir: examples)


def test_the_layout_is_recognized_and_ours_is_not():
  from vmoe_sparse_ot.config import schema
  assert reference.is_reference(_s32())
  assert not reference.is_reference(schema.base_config())
  assert reference.resolve(schema.base_config(), log=print) is not None


def test_s32_data_evaluation_and_checkpoints_by_hand():
  ours, notes = _translate(_s32())
  # 300 epochs of 1,268,355 examples at batch 4096, rounded up as there.
  assert ours.train_steps == math.ceil(300 * TRAIN_EXAMPLES / 4096) == 92_898  # 380,506,500 / 4096 = 92,897.09
  d = ours.dataset
  assert (d.name, d.train_split, d.eval_split) == ('imagenet2012', 'train[:99%]', 'validation')
  assert (d.image_size, d.channels, d.shuffle_buffer) == (224, 3, 50_000)
  # ... which the default sampling does not read: the run says so.
  assert any(n.startswith('dataset.train.shuffle_buffer (kept as dataset.shuffle_buffer for '
                          "dataset.sampling='stream': the default 'index'") for n in notes)
  labels = 'onehot(1000, inkey="label", outkey="labels")|keep("image", "labels")'
  assert d.pp_train == ('decode_jpeg_and_inception_crop(224)|flip_lr|randaug(2, 10)|'
                        f'value_range(-1,1)|{labels}')
  assert d.pp_eval == f'decode|resize_small(256)|central_crop(224)|value_range(-1,1)|{labels}'
  assert (ours.batch_size, ours.eval_batch_size) == (4096, 4096)
  extra = ours.evaluate.datasets.to_dict()
  assert extra == {
      'val': {'dataset': 'imagenet2012', 'split': 'train[99%:]', 'pp': d.pp_eval},
      'imagenet_v2': {'dataset': 'imagenet_v2', 'split': 'test', 'pp': d.pp_eval},
      # Its pp reads the feature real_label: the label_key of that dataset here.
      'imagenet_real': {'dataset': 'imagenet2012_real', 'split': 'validation',
               'pp': 'decode|resize_small(256)|central_crop(224)|value_range(-1,1)|onehot('
                     '1000, inkey="real_label", outkey="labels")|keep("image", "labels")',
               'label_key': 'real_label'}}
  assert ours.evaluate.model_overrides.to_dict() == {
      'encoder': {'moe': {'router': {'capacity_factor': 4.0}}}}
  assert ours.eval_every_steps == 1000 and ours.log_every_steps == 100
  assert (ours.checkpoint.every_steps, ours.checkpoint.keep) == (1000, 1)
  assert ours.mesh.expert == 8 and ours.seed == 0
  assert ours.loss.name == 'sigmoid_xent'
  assert (ours.mixup.p, ours.mixup.granularity, ours.mixup.size) == (0.2, 'device', 2)
  assert ours.profile.to_dict() == {'all_processes': False, 'num_profile_steps': 5,
                                    'first_profile': 10, 'every_secs': 3600.0}
  # Each key with no effect is named once, with its reason.
  named = [n.split(' ')[0] for n in notes]
  assert set(named) == {'description', 'params_axis_resources', 'extra_rng_keys',
                        'dataset.*.prefetch', 'dataset.*.prefetch_device', 'dataset.*.cache',
                        'dataset.*.manual_dir', 'model.encoder.moe.router.dispatcher.'
                        'partition_spec', 'save_checkpoint.wait_seconds',
                        'report_progress.every_secs', 'dataset.train.shuffle_buffer'}
  assert len(named) == len(set(named))


def test_s32_model_optimizer_and_schedule_by_hand():
  ours, _ = _translate(_s32())
  m = ours.model
  assert (m.name, m.num_classes, tuple(m.patch_size), m.hidden_size, m.classifier,
          m.representation_size) == ('vit_moe', 1000, (32, 32), 512, 'token', 512)
  assert m.head_bias_init == pytest.approx(-math.log(1000))
  e = m.encoder
  assert (e.num_layers, e.mlp_dim, e.num_heads, e.dropout_rate) == (8, 2048, 8, 0.0)
  assert (e.moe.num_experts, e.moe.layers, e.moe.group_size, e.moe.dropout_rate,
          e.moe.split_rngs) == (8, '5,7', 400, 0.2, False)
  assert (e.moe.dispatcher, e.moe.routed_tokens_dtype) == ('einsum', 'bfloat16')
  r = e.moe.router
  assert (r.name, r.num_selected_experts, r.noise_std, r.capacity_factor, r.batch_priority,
          r.importance_loss_weight, r.load_loss_weight) == ('topk', 2, 1.0, 1.05, False,
                                                            0.005, 0.005)
  o = ours.optimizer
  assert (o.name, o.b1, o.b2, o.mu_dtype, o.gradient_clip_norm) == (
      'adam', 0.9, 0.999, 'float32', 1.0)
  assert [tuple(p) for p in o.weight_decay] == [('.*/kernel', 0.1)]
  s = ours.schedule
  assert (s.name, s.peak_value, s.end_value, s.warmup_steps, s.decay_steps) == (
      'warmup_linear_decay', 3e-3, 1e-5, 10_000, None)


def _abstract_variables(config):
  import jax
  import jax.numpy as jnp
  from vmoe_sparse_ot import nn as vnn
  model = vnn.build_model(config.model)
  size = config.dataset.image_size
  return jax.eval_shape(lambda k: model.init(
      {'params': k}, jnp.zeros((1, size, size, config.dataset.channels)), train=False),
      jax.random.key(0))


def _leaves(tree):
  import jax
  return jax.tree.leaves(tree)


def _param_count(config) -> int:
  return sum(int(np.prod(x.shape)) for x in _leaves(_abstract_variables(config)))


def test_translated_models_have_the_reference_parameter_counts():
  from tests.nn.test_vit import _reference_param_count
  s32, _ = _translate(_s32())
  # V-MoE S/32, E=8, 2 MoE blocks, pre-logits 512, 1000 classes, at 224 px.
  assert _param_count(s32) == _reference_param_count(512, 8, 2048, 32, 224, 1000, 8, 2,
                                                     512) == 56_999_400
  b16, _ = _translate(files.load_config_file(B16_FT, translate=False))
  # V-MoE B/16, E=8, 6 MoE blocks, no pre-logits, 10 classes, at 384 px.
  assert _param_count(b16) == _reference_param_count(768, 12, 3072, 16, 384, 10, 8, 6, None)


def test_weight_decay_regexes_are_matched_against_the_reference_names():
  """The S/32 file's [('.*/kernel', 0.1)] decays every kernel the reference's does,
  the experts' (Moe/Mlp/Dense_{0,1}/kernel there, moe/experts/w{i,o}_kernel here)
  included. Counted by hand for V-MoE S/32 (D 512, MLP 2048, 8 blocks, MoE in 5
  and 7 with E = 8, 1000 classes): embedding 32*32*3*512, attention 8 * 4*512*512,
  dense MLPs 6 * 2*512*2048, experts 2 * 8 * 2*512*2048, routers 2 * 512*8,
  pre-logits 512*512, head 512*1000."""
  ours, _ = _translate(_s32())
  assert ours.optimizer.param_naming == 'vmoe'
  params = _abstract_variables(ours)['params']
  factors = optimizer.weight_decay_factors(params, ours.optimizer.weight_decay,
                                           ours.optimizer.param_naming)
  decayed = sum(int(np.prod(x.shape)) for x, f in zip(_leaves(params), _leaves(factors))
                if f == 0.1)
  assert decayed == (32 * 32 * 3 * 512 + 8 * 4 * 512 * 512 + 6 * 2 * 512 * 2048
                     + 2 * 8 * 2 * 512 * 2048 + 2 * 512 * 8 + 512 * 512 + 512 * 1000)
  block = factors['encoder']['encoderblock_5']
  assert (block['moe']['experts']['wi_kernel'], block['moe']['experts']['wo_kernel'],
          block['moe']['experts']['wi_bias'], block['norm_mlp']['scale']) == (0.1, 0.1, 0.0, 0.0)
  # Matched against our names, '.*/kernel' would miss the experts (the bug this fixes).
  ours_naming = optimizer.weight_decay_factors(params, ours.optimizer.weight_decay)
  assert ours_naming['encoder']['encoderblock_5']['moe']['experts']['wi_kernel'] == 0.0


def test_frozen_patterns_are_matched_against_the_reference_names():
  config = _s32()
  config.optimizer.frozen_pattern = ('Encoder/encoderblock_[0-6]/', 'Moe/Mlp/Dense_0')
  ours, _ = _translate(config)
  params = _abstract_variables(ours)['params']
  frozen = optimizer.frozen_names(params, ours.optimizer.freeze, ours.optimizer.param_naming)
  assert {name.split('/')[1] for name in frozen} == {f'encoderblock_{i}' for i in range(8)}
  # Block 7: its first expert layer alone (Moe/Mlp/Dense_0 there).
  assert sorted(n for n in frozen if 'encoderblock_7' in n) == [
      'encoder/encoderblock_7/moe/experts/wi_bias', 'encoder/encoderblock_7/moe/experts/wi_kernel']


def test_e3_s32_config_translates_and_has_its_parameter_count_by_hand():
  ours, _ = _translate(files.load_config_file(EEE, translate=False))
  m = ours.model
  assert (m.name, m.ensemble_size, ours.loss.name) == ('vit_moe', 2, 'softmax_xent')
  # group_size counts both members' tokens: 128 images per device x 17 tokens x 2.
  assert (m.encoder.moe.group_size, m.encoder.moe.layers) == (4352, '5,7')
  assert m.encoder.moe.router.num_selected_experts == 1
  # The router reshape rule is a default here; the head is dropped.
  assert ours.initialization.rules == (('head/.*', ''),)
  # E³-S/32 at 128 px: 16 patches + class token, D 512, 8 blocks, MoE (E=8) in 5 and 7,
  # pre-logits 512, 100 classes. The same parameters as the V-MoE it starts from.
  d, mlp, e = 512, 2048, 8
  embedding = 32 * 32 * 3 * d + d
  tokens = d + 17 * d                                     # cls, pos_embedding
  attention = 3 * (d * d + d) + (d * d + d)               # q, k, v, out
  norms = 2 * 2 * d
  mlp_params = d * mlp + mlp + mlp * d + d
  dense_block = norms + attention + mlp_params
  moe_block = norms + attention + e * mlp_params + d * e  # experts, router kernel (D, E)
  top = 2 * d + (d * d + d) + (d * 100 + 100)             # encoder_norm, pre_logits, head
  assert _param_count(ours) == (embedding + tokens + 6 * dense_block + 2 * moe_block
                                + top) == 56_520_804


def test_moe_mlp_dim_sets_the_experts_width_and_its_parameter_count_by_hand():
  """The reference passes the `moe` dict to its MoE blocks: moe.mlp_dim is the experts'
  hidden size, the dense blocks keep the encoder's. V-MoE S/32 (56,999,400 parameters)
  with experts of 1024: each of the 2 x 8 experts has 512*1024 + 1024 + 1024*512 + 512
  = 1,050,112 parameters instead of 512*2048 + 2048 + 2048*512 + 512 = 2,099,712."""
  config = _s32()
  config.model.encoder.moe.mlp_dim = 1024
  ours, _ = _translate(config)
  assert (ours.model.encoder.mlp_dim, ours.model.encoder.moe.mlp_dim) == (2048, 1024)
  params = _abstract_variables(ours)['params']['encoder']
  assert params['encoderblock_5']['moe']['experts']['wi_kernel'].shape == (8, 512, 1024)
  assert params['encoderblock_4']['mlp']['Dense_0']['kernel'].shape == (512, 2048)
  assert _param_count(ours) == 56_999_400 - 16 * (2_099_712 - 1_050_112) == 40_205_800


def test_e3_keys_that_do_not_fit_together_are_one_line():
  config = files.load_config_file(EEE, translate=False)
  config.loss.ensemble_size = 4
  with pytest.raises(reference.ReferenceConfigError, match=r'loss.ensemble_size=4'):
    _translate(config)
  config.loss = ml_collections.ConfigDict({'name': 'softmax_xent'})
  config.model.name = 'VisionTransformerMoe'
  with pytest.raises(reference.ReferenceConfigError, match=r'model.encoder.moe.ensemble_size'):
    _translate(config)


def test_b16_fine_tuning_config_by_hand():
  ours, notes = _translate(files.load_config_file(f'{B16_FT}:variant=fast', translate=False))
  d = ours.dataset
  assert (d.name, d.train_split, d.eval_split, d.image_size, d.shuffle_buffer) == (
      'cifar10', 'train[:98%]', 'test', 384, 25_000)
  assert list(ours.evaluate.datasets) == ['val']
  assert (ours.batch_size, ours.eval_batch_size, ours.microsteps, ours.train_steps,
          ours.seed) == (512, 1024, 2, 1000, 3)
  # sgd with its momentum dtype; the schedule's decay_steps counted from the warmup's end.
  assert (ours.optimizer.name, ours.optimizer.momentum, ours.optimizer.mu_dtype,
          ours.optimizer.gradient_clip_norm) == ('sgd', 0.9, 'float32', 10.0)
  # Without its momentum key the reference's SGD has none (ours defaults to 0.9).
  config = files.load_config_file(f'{B16_FT}:variant=fast', translate=False)
  del config.optimizer['momentum']
  assert _translate(config)[0].optimizer.momentum == 0.0
  s = ours.schedule
  assert (s.name, s.peak_value, s.end_value, s.warmup_steps, s.decay_steps) == (
      'warmup_cosine_decay', 0.03, 1e-5, 100, 800)
  r = ours.model.encoder.moe.router
  assert (r.capacity_factor, r.batch_priority) == (1.5, True)
  assert ours.model.encoder.moe.layers == '1,3,5,7,9,11'
  i = ours.initialization
  assert (i.path, [tuple(r) for r in i.rules], i.raise_if_target_unmatched) == (
      'gs://my_bucket/vmoe_b16_e8_every2', [('head/.*', '')], False)
  c = ours.checkpoint
  assert (c.every_steps, c.keep, c.keep_steps_multiple_of) == (250, 2, 500)
  assert (ours.eval_every_steps, ours.log_every_steps) == (250, 50)
  f = ours.fewshot
  assert (list(f.datasets), f.every_steps, f.batch_size, f.l2_selection) == (
      ['pets'], 500, 1024, 'reference')
  assert f.pp == 'decode|resize(256)|central_crop(224)|value_range(-1, 1)|keep("image", "label")'


def test_the_reference_defaults_apply_where_the_file_is_silent():
  config = _s32()
  del config.model.encoder.moe.router['importance_loss_weight']
  del config.model.encoder.moe.router['num_selected_experts']
  del config.model.encoder.moe['dropout_rate']
  del config.mixup['granularity']
  ours, _ = _translate(config)
  router = ours.model.encoder.moe.router
  assert (router.importance_loss_weight, router.num_selected_experts) == (1.0, 1)
  assert ours.mixup.granularity == 'device'
  # The experts' dropout: the encoder's rate, as there (its ViT passes it to the MoE MLPs).
  config.model.encoder.dropout_rate = 0.1
  ours, _ = _translate(config)
  assert (ours.model.encoder.moe.dropout_rate, ours.model.encoder.dropout_rate) == (None, 0.1)
  # (None: each MoE block takes its block's rate, nn/vit.py.)


def _reference_lr(step, *, peak, end, warmup, decay_steps, total, schedule):
  """The reference's schedules written out: decay_steps counts from step 0 (default total)."""
  decay_steps = decay_steps or total
  if step < warmup:
    return peak * step / warmup
  frac = min(1.0, (step - warmup) / (decay_steps - warmup))
  if schedule == 'warmup_linear_decay':
    return (peak - end) * (1 - frac) + end
  if schedule == 'warmup_cosine_decay':
    return end + (peak - end) * 0.5 * (1 + math.cos(math.pi * frac))
  raise AssertionError(schedule)


@pytest.mark.parametrize('schedule', ['warmup_linear_decay', 'warmup_cosine_decay'])
@pytest.mark.parametrize('decay_steps', [None, 80])
def test_learning_rate_at_every_step_equals_the_reference_formula(schedule, decay_steps):
  config = _s32()
  config.optimizer.learning_rate = ml_collections.ConfigDict(
      {'schedule': schedule, 'peak_value': 3e-3, 'end_value': 1e-5, 'warmup_steps': 10})
  if decay_steps:
    config.optimizer.learning_rate.decay_steps = decay_steps
  config.train_epochs = 1
  ours, _ = _translate(config, examples=100 * 4096)  # 100 steps
  assert ours.train_steps == 100
  lr = optimizer.make_schedule(ours.schedule, ours.train_steps)
  steps = np.arange(0, 101)
  got = np.array([float(lr(t)) for t in steps])
  want = np.array([_reference_lr(int(t), peak=3e-3, end=1e-5, warmup=10,
                                 decay_steps=decay_steps, total=100, schedule=schedule)
                   for t in steps], np.float32)
  np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-9)


def test_a_float_learning_rate_and_a_float_weight_decay():
  config = _s32()
  del config.optimizer['learning_rate'], config.optimizer['weight_decay']
  config.optimizer.learning_rate = 0.01
  config.optimizer.weight_decay = 0.1
  ours, _ = _translate(config)
  assert (ours.schedule.name, ours.schedule.peak_value, ours.schedule.warmup_steps) == (
      'constant', 0.01, 0)
  # A float decays every parameter there.
  assert (ours.optimizer.weight_decay, ours.optimizer.weight_decay_regex) == (0.1, '.*')


def _cannot_read(name, split, data_dir):
  raise FileNotFoundError(f'{name} is not prepared')


def _command_line(*overrides):
  """The reference config that main's --config flag gives, with `overrides` applied."""
  from absl import flags
  from ml_collections import config_flags
  from vmoe_sparse_ot.config import cli
  argv = ['prog', f'--config={S32}', *overrides]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', None, flag_values=values, lock_config=True,
                                  sys_argv=argv)
  values['config'].parser = cli.ConfigFileParser('config')
  values(argv)
  return values.config


def test_train_steps_on_the_command_line_replaces_the_files_train_epochs():
  """The S/32 file has train_epochs alone; without the split's size the refusal says
  to give --config.train_steps, and that works."""
  with pytest.raises(reference.ReferenceConfigError) as e:
    reference.translate(_command_line(), num_examples=_cannot_read)
  assert ('needs the size of imagenet2012:train[:99%], which cannot be read '
          '(FileNotFoundError): prepare it under dataset.train.data_dir, or give '
          '--config.train_steps=N instead') in str(e.value)
  ours, notes = reference.translate(_command_line('--config.train_steps=1234'),
                                    num_examples=_cannot_read)
  assert ours.train_steps == 1234
  assert 'train_epochs (train_steps=1234 is given, which sets the length of the run)' in notes
  # Left alone, the file's train_epochs gives the steps: ceil(300 x 1268355 / 4096).
  assert _translate(_command_line())[0].train_steps == 92_898


def test_the_soft_moe_recipe_keys_translate():
  """The Soft MoE recipe's model keys (its common.get_vmoe_soft_router_config) on the
  S/32 file: qk-norm, sincos2d, MAP head, a head drawn at random, the SoftRouter."""
  config = _s32()
  with config.unlocked() if hasattr(config, 'unlocked') else _nothing():
    m = config.model
    m.classifier, m.head_kernel_zero_init = 'map', False
    m.encoder.attention_qk_norm = True
    m.encoder.position_emb = {'name': 'sincos2d'}
    m.encoder.moe.router = {'name': 'SoftRouter', 'capacity_factor': None, 'num_slots': 2,
                            'partition_spec': (('expert', 'replica'),),
                            'compute_similarity_metrics': False}
    m.encoder.moe.router.noise_std = 0.5
  ours, notes = _translate(config)
  m = ours.model
  assert (m.classifier, m.head_kernel_zero_init, m.encoder.attention_qk_norm,
          m.encoder.position_emb) == ('map', False, True, 'sincos2d')
  r = m.encoder.moe.router
  assert (r.name, r.soft_moe.num_slots, r.soft_moe.noise_std,
          r.soft_moe.compute_similarity_metrics) == ('soft_moe', 2, 0.5, False)
  assert m.encoder.moe.routed_tokens_dtype == 'bfloat16'   # its Bfloat16Dispatcher
  # ... always, whatever the file says of a dispatcher.
  config.model.encoder.moe.router.dispatcher = {'bfloat16': False}
  assert _translate(config)[0].model.encoder.moe.routed_tokens_dtype == 'bfloat16'
  del config.model.encoder.moe.router['dispatcher']
  assert any(n.startswith('model.encoder.moe.router.partition_spec') for n in notes)
  # Left out, the SoftRouter computes its similarity metrics, as there.
  del config.model.encoder.moe.router['compute_similarity_metrics']
  assert _translate(config)[0].model.encoder.moe.router.soft_moe.compute_similarity_metrics


@pytest.mark.parametrize('edit, key', [
    (lambda c: setattr(c, 'not_a_key', 1), 'not_a_key'),
    (lambda c: c.model.encoder.__setattr__('position_emb', {'name': 'sincos2d',
                                                           'temperature': 100.0}),
     'model.encoder.position_emb.temperature'),
    (lambda c: c.model.encoder.moe.router.__setattr__('num_slots', 1),
     'model.encoder.moe.router.num_slots'),
    (lambda c: c.model.encoder.moe.router.__setattr__('maxiter', 5),
     'model.encoder.moe.router.maxiter'),
    (lambda c: c.model.__setattr__('classifier', 'mean'), 'model.classifier'),
    (lambda c: c.optimizer.learning_rate.__setattr__('decay_steps', 5_000),
     'optimizer.learning_rate.decay_steps'),
    (lambda c: c.dataset.train.__setattr__('process', 'decode|flip_lr'),
     'dataset.train.process'),
    (lambda c: c.optimizer.learning_rate.__setattr__('schedule', 'warmup_rsqrt'),
     'optimizer.learning_rate.schedule'),
    # The evaluation of dataset.eval_split reads 'label'; two label features, none.
    (lambda c: c.dataset.test.__setattr__('process', c.dataset.imagenet_real.process),
     'dataset.test.process'),
    (lambda c: c.dataset.imagenet_real.__setattr__(
        'process', 'decode|ignore_no_labels(labels_key="a")|' + c.dataset.imagenet_real.process),
     'dataset.imagenet_real.process'),
    # A router that computes in bfloat16, or that is deterministic in training.
    (lambda c: c.model.encoder.moe.router.__setattr__('dtype', 'bfloat16'),
     'model.encoder.moe.router.dtype'),
    (lambda c: c.model.encoder.moe.router.__setattr__('deterministic', True),
     'model.encoder.moe.router.deterministic'),
    # Another model's file (its own keys too) is refused by the model's class.
    (lambda c: (c.model.__setattr__('name', 'vmoe.projects.contrastive.models.TwoTower'),
                c.model.__setattr__('bias_init', -10.0)), 'model.name'),
])
def test_keys_that_cannot_be_translated_are_one_line_naming_them(edit, key):
  config = _s32()
  with config.unlocked() if hasattr(config, 'unlocked') else _nothing():
    edit(config)
  with pytest.raises(reference.ReferenceConfigError) as e:
    _translate(config)
  message = str(e.value)
  assert '\n' not in message and re.search(rf'\b{re.escape(key)}\b', message), message


class _nothing:
  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


def test_initialization_rules_of_a_fine_tuning_config():
  config = _s32()
  config.initialization = ml_collections.ConfigDict({
      'name': 'initialize_from_vmoe', 'prefix': '/ckpts/vmoe_s32',
      'rules': [('head', ''), ('pre_logits/.*', ''),
                ('^(.*/pos_embedding)$', r'params/\1', 'vit_zoom'), ('^(.*)$', r'params/\1')],
      'raise_if_target_unmatched': False,
      'axis_resources_regexes': [('Moe/Mlp/.*', ('expert',))]})
  ours, notes = _translate(config)
  i = ours.initialization
  assert (i.path, i.raise_if_target_unmatched) == ('/ckpts/vmoe_s32', False)
  assert [tuple(r) for r in i.rules] == [('head/.*', ''), ('pre_logits/.*', '')]
  assert any(n.startswith('initialization.axis_resources_regexes') for n in notes)
  config.initialization.rules = [('Encoder/.*', '')]
  with pytest.raises(reference.ReferenceConfigError, match=r'initialization\.rules\[0\]'):
    _translate(config)


def test_fewshot_section():
  config = _s32()
  config.fewshot = ml_collections.ConfigDict({
      'datasets': {'pets': ('oxford_iiit_pet', 'train', 'test'),
                   'col_hist': ('colorectal_histology', 'train[:2000]', 'train[2000:]')},
      'shots': [1, 5], 'l2_regs': [2.0 ** i for i in range(-2, 3)], 'batch_size': 512,
      'process': 'decode|resize(256)|central_crop(224)|value_range(-1, 1)',
      'every_steps': 5000, 'seeds_per_step': 2, 'main_task': ('pets', 5),
      'model_overrides': {'num_classes': None}})
  ours, notes = _translate(config)
  f = ours.fewshot
  assert f.datasets.to_dict() == {
      'pets': {'name': 'oxford_iiit_pet', 'train_split': 'train', 'test_split': 'test'},
      'col_hist': {'name': 'colorectal_histology', 'train_split': 'train[:2000]',
                   'test_split': 'train[2000:]'}}
  assert (tuple(f.shots), f.batch_size, f.every_steps, tuple(f.seeds)) == (
      (1, 5), 512, 5000, (0, 1))
  assert tuple(f.l2_regs) == (0.25, 0.5, 1.0, 2.0, 4.0)
  assert f.l2_selection == 'reference'
  assert f.pp == 'decode|resize(256)|central_crop(224)|value_range(-1, 1)'
  assert {n.split(' ')[0] for n in notes} >= {'fewshot.main_task',
                                              'fewshot.model_overrides.num_classes'}
  assert 'fewshot.process' not in ' '.join(notes)


def test_the_docs_show_the_mapping_table():
  with open(os.path.join(HERE, '..', '..', 'docs', 'REFERENCE.md')) as f:
    text = f.read()
  assert reference.markdown_table() in text, (
      'docs/REFERENCE.md: paste reference.markdown_table() between its markers')


def test_the_shrunk_reference_run_script_resolves_its_overrides(tmp_path):
  """scripts/reference_s32_embedded.sh on a stand-in checkout of the reference code
  (this test's S/32 file at the reference file's path): every override names the
  file's own keys, and the translated config is the embedded-data run."""
  checkout = tmp_path / 'vmoe'
  target = checkout / 'vmoe' / 'configs' / 'vmoe_paper'
  target.mkdir(parents=True)
  shutil.copy(S32, target / 'vmoe_s32_last2_ilsvrc2012_randaug_light1.py')
  proc = subprocess.run(['bash', 'scripts/reference_s32_embedded.sh', str(checkout),
                         '--print_config'], cwd=ROOT, capture_output=True, text=True,
                        timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  config = json.loads(proc.stdout[proc.stdout.index('{'):])
  assert config['train_steps'] == 4096 // 128
  assert (config['dataset']['name'], config['dataset']['eval_split'],
          config['dataset']['image_size']) == ('embedded_mnist', 'test[:1024]', 32)
  assert config['evaluate']['datasets']['imagenet_v2']['dataset'] == 'sklearn_digits'
  assert config['model']['encoder']['moe']['dropout_rate'] == 0.2
  assert config['evaluate']['model_overrides'] == {
      'encoder': {'moe': {'router': {'capacity_factor': 4.0}}}}
  assert 'read a config in the reference V-MoE layout' in proc.stderr


def test_a_key_with_no_mapping_exits_2_in_one_line_and_writes_nothing(tmp_path):
  bad = tmp_path / 'bad.py'
  with open(S32) as f:
    bad.write_text(f.read().replace('  config.seed = 0', '  config.seed = 0\n  config.warmup = 3'))
  workdir = tmp_path / 'run'
  refused, = main_cases.run_main_cases([[f'--config={bad}', f'--workdir={workdir}']],
                                       dict(os.environ))
  assert refused.returncode == 2
  assert refused.stderr.strip().count('\n') == 0 and 'warmup' in refused.stderr, refused.stderr
  assert not workdir.exists()


OT_ROUTERS = os.path.join(HERE, 'reference_configs', 'ot_routers_mnist.py')
_R = 'model.encoder.moe.router'
# Each of the paper's routers in ot_routers_mnist.py: our router, and its options by hand.
OT_CASES = {
    'ksparse_ec': ('sparse_ot', {'form': 'expert_choice', 'solver': 'adam', 'num_steps': 30,
                                 'learning_rate': 0.05, 'combine_weights': 'plan',
                                 'dispatch_zeros': True, 'k': None}, 1),
    'ksparse_tc': ('sparse_ot', {'form': 'token_choice', 'solver': 'adam', 'num_steps': 20,
                                 'learning_rate': 0.02, 'combine_weights': 'softmax',
                                 'dispatch_zeros': True}, 2),
    'l2': ('l2_ot', {'num_steps': 10, 'learning_rate': 0.01, 'combine_weights': 'plan',
                     'dispatch_zeros': True, 'implicit_differentiation': True}, 1),
    'kl_tc': ('kl_ot', {'form': 'token_choice', 'solver': 'lbfgs', 'num_iters': 20,
                        'combine_weights': 'softmax', 'implicit_differentiation': True,
                        'importance_loss_weight': 0.01, 'load_loss_weight': 0.0}, 2),
    'kl_ec': ('kl_ot', {'form': 'expert_choice', 'solver': 'sinkhorn', 'num_iters': 5,
                        'combine_weights': 'softmax', 'implicit_differentiation': False,
                        'importance_loss_weight': 0.0, 'load_loss_weight': 0.0}, 1),
}


def _ot_config(arg):
  return files.load_config_file(f'{OT_ROUTERS}:{arg}', translate=False)


@pytest.mark.parametrize('arg', sorted(OT_CASES))
def test_the_papers_routers_by_their_dotted_paths(arg):
  from vmoe_sparse_ot.config import validation
  from vmoe_sparse_ot.nn import routers
  ours, notes = _translate(_ot_config(arg))
  name, options, k = OT_CASES[arg]
  router = ours.model.encoder.moe.router
  assert router.name == name and notes == []
  assert {key: router[name][key] for key in options} == options
  assert (router.num_selected_experts, router.capacity_factor) == (k, 1.0)
  validation.validate(ours)
  parsed = routers.parse_router_options(router.to_dict())
  assert (parsed.name, parsed.options.num_selected_experts) == (name, k)
  if name == 'kl_ot':
    assert router.noise_std == (0.5 if arg == 'kl_tc' else 1.0)
  # C as there: S / E = 34 / 4 -> 9, a multiple of 4: 12 (expert choice; the k-sparse
  # router's k); S K / E (token choice).
  want = 12 if k == 1 else 20
  assert routers.ROUTERS[name].capacity(parsed.options, 34, 4) == want


def test_the_papers_routers_have_the_parameters_counted_by_hand():
  # ViT with D 32, 8x8 patches of 32 px (16 + a class token), 2 blocks (block 1 MoE with
  # E = 4 experts of MLP 64 and a (D, E) router kernel), 10 classes, no pre-logits.
  d, mlp, e = 32, 64, 4
  embedding = 8 * 8 * 3 * d + d
  tokens = d + 17 * d
  attention = 4 * (d * d + d)
  norms = 2 * 2 * d
  mlp_params = d * mlp + mlp + mlp * d + d
  want = (embedding + tokens + 2 * (norms + attention) + mlp_params + e * mlp_params + d * e
          + 2 * d + d * 10 + 10)
  counts = {arg: _param_count(_translate(_ot_config(arg))[0]) for arg in ('ksparse_ec', 'kl_tc')}
  assert counts == {'ksparse_ec': want, 'kl_tc': want} and want == 36_938


def test_the_papers_routers_options_elsewhere_and_the_gshard_loss():
  config = _ot_config('kl_tc')
  config.model.encoder.moe.router.adam_lr = 0.1
  with pytest.raises(reference.ReferenceConfigError,
                     match=r'router.adam_lr=0.1: read by KSparseProjectionTransportTop'
                           r'ExpertsPerItemRouter, KSparseProjection.*only'):
    _translate(config)
  config = _ot_config('ksparse_tc')
  config.model.encoder.moe.router.name = 'NoisyTopExpertsPerItemRouter'
  del config.model.encoder.moe.router['adam_lr']
  config.model.encoder.moe.router.gshard_loss_weight = 0.25
  ours, _ = _translate(config)
  assert (ours.model.encoder.moe.router.name,
          ours.model.encoder.moe.router.gshard_loss_weight) == ('topk', 0.25)
  config.model.encoder.moe.router.name = 'NoisyTopItemsPerExpertRouter'
  del config.model.encoder.moe.router['num_selected_experts']
  with pytest.raises(reference.ReferenceConfigError, match=r'gshard_loss_weight=0.25'):
    _translate(config)
