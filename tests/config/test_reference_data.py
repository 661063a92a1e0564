"""Reference config files and the data they read: what needs the data, what does not.

- `--print_config` of a file with `train_epochs` shows the steps as their formula
  where the training split's size cannot be read (no data here), and says so.
- A training pp string with no size op takes the stored images' size from the
  dataset's TFDS info when they have one (the reference's model takes the images
  as stored), and is one line naming the key when they do not.
"""
import json
import os

import pytest

from tests import main_cases
from tests.config.test_reference import S32, _cannot_read, _s32
from vmoe_sparse_ot.config import reference

LABELS = 'onehot(10, inkey="label", outkey="labels")|keep("image", "labels")'
NO_SIZE = f'decode|value_range(-1,1)|{LABELS}'

# A tiny reference-layout run on the embedded MNIST, written here: block 1 an MoE layer
# of 2 experts with their own width (moe.mlp_dim), 2 steps of SGD.
TINY = f'''import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.dataset = ml_collections.ConfigDict()
  c.dataset.train = dict(name='embedded_mnist', split='train[:64]', batch_size=16,
                         process={NO_SIZE!r})
  c.dataset.test = dict(name='embedded_mnist', split='test[:32]', batch_size=16,
                        process={NO_SIZE!r})
  c.train_steps = 2
  c.loss = dict(name='softmax_xent')
  c.model = dict(
      name='VisionTransformerMoe', num_classes=10, patch_size=(14, 14), hidden_size=8,
      classifier='token', representation_size=None,
      encoder=dict(num_layers=2, mlp_dim=16, num_heads=2, dropout_rate=0.0,
                   attention_dropout_rate=0.0,
                   moe=dict(layers=(1,), num_experts=2, group_size=10, mlp_dim=8,
                            router=dict(num_selected_experts=1, noise_std=0.0,
                                        dispatcher=dict(name='einsum',
                                                        capacity_factor=1.0)))))
  c.optimizer = dict(name='sgd', learning_rate=0.1, momentum=0.0)
  c.save_checkpoint = dict(every_steps=2, keep_last=1)
  return c
'''


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """The command lines of these tests, in one interpreter (tests/main_cases.py):
  {name: (Result, folder)}."""
  folder = tmp_path_factory.mktemp('reference_data')
  tiny = folder / 'tiny.py'
  tiny.write_text(TINY)
  imagenet = [f'--config.dataset.{v}.name=imagenet2012' for v in ('train', 'test')]
  cases = {
      'printed': [f'--config={S32}', '--print_config'],
      'not_trained': [f'--config={S32}', f'--workdir={folder}/s32'],
      'trained': [f'--config={tiny}', f'--workdir={folder}/run'],
      'varying': [f'--config={tiny}', f'--workdir={folder}/other', *imagenet],
  }
  results = main_cases.run_main_cases(list(cases.values()), dict(os.environ))
  return dict(zip(cases, results)), folder


def test_print_config_of_train_epochs_without_the_data_shows_the_formula(runs):
  """The S/32 file reads imagenet2012's train[:99%], which is not here: printing shows
  train_steps as ceil(300 x examples / 4096) and says so in one line; training refuses."""
  formula = 'ceil(300 * examples(imagenet2012:train[:99%]) / 4096)'
  ours, _ = reference.translate(_s32(), num_examples=_cannot_read, steps_formula=True)
  assert ours.train_steps == formula
  with pytest.raises(reference.ReferenceConfigError, match='train_epochs=300: needs the size'):
    reference.translate(_s32(), num_examples=_cannot_read)
  results, _ = runs
  printed, trained = results['printed'], results['not_trained']
  assert printed.returncode == 0, printed.stderr[-2000:]
  assert json.loads(printed.stdout[printed.stdout.index('{'):])['train_steps'] == formula
  said = [line for line in printed.stderr.splitlines() if 'train_steps' in line]
  assert said == [f'train_steps is shown as the formula {formula}: the size of the training '
                  'split cannot be read here; training reads it (prepare the data under '
                  'dataset.train.data_dir, or give --config.train_steps=N)']
  assert trained.returncode == 2 and 'train_epochs=300: needs the size' in trained.stderr


def test_translation_takes_a_fixed_stored_size_and_refuses_a_varying_one():
  config = _s32()
  config.dataset.train.process = NO_SIZE
  shapes = {'fixed': (32, 32, 3), 'varying': (None, None, 3)}
  ours, _ = reference.translate(config, num_examples=lambda *a: 4096,
                                image_shape=lambda name, data_dir: shapes['fixed'])
  assert (ours.dataset.image_size, ours.dataset.pp_train) == (32, NO_SIZE)
  with pytest.raises(reference.ReferenceConfigError) as e:
    reference.translate(config, num_examples=lambda *a: 4096,
                        image_shape=lambda name, data_dir: shapes['varying'])
  assert str(e.value) == (
      f'reference config key dataset.train.process={NO_SIZE!r}: no op fixes the image size '
      '(one of central_crop, decode_jpeg_and_inception_crop, inception_crop, random_crop, '
      "resize with a size), and the dataset's images have no fixed size (None, None, 3)")


def test_a_pp_string_with_no_size_op_trains_on_fixed_size_images(runs):
  """On the embedded MNIST (28 x 28 as stored) the run trains; on imagenet2012, whose
  images vary in size (its TFDS info says so without the data), one line, exit status 2."""
  results, folder = runs
  trained, refused = results['trained'], results['varying']
  assert trained.returncode == 0, trained.stderr[-3000:]
  assert 'Final test[:32] accuracy at step 2' in trained.stdout
  with open(folder / 'run' / 'config.json') as f:
    run = json.load(f)
  assert (run['dataset']['image_size'], run['dataset']['channels']) == (28, 3)
  assert run['model']['encoder']['moe']['mlp_dim'] == 8
  assert refused.returncode == 2, refused.stderr[-2000:]
  line, = [x for x in refused.stderr.strip().splitlines() if 'dataset.train.process' in x]
  assert "no fixed size (None, None, 3)" in line
  assert not (folder / 'other').exists()
