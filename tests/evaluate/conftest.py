"""One tiny trained workdir per session, shared by the evaluation job and `load` API tests.

The tiny MNIST V-MoE (tests/train/helpers.SMALL), shrunk further: D=16, two
blocks that are both MoE layers (E=4 experts, K=2, groups of S=32 tokens, so C=16
at capacity factor 1 and C=8 at 0.5), trained with TopK for 4 steps on one device
(`train`), checkpoints at steps 2 and 4; evaluation on the first 200 test images
in batches of 64 (the last one padded with 56 masked images).
"""
import fcntl
import functools
import shutil

import jax
import numpy as np
import pytest

from vmoe_sparse_ot.train import run_record
from tests.train.helpers import small_config

EVAL_SPLIT = 'test[:200]'
EVAL_BATCH = 64
TRAIN_STEPS = 4


def tiny_config():
  return small_config('router=topk', **{
      'model.hidden_size': 16, 'model.encoder.num_layers': 2, 'model.encoder.mlp_dim': 32,
      'model.encoder.moe.layers': '0,1', 'dataset.train_split': 'train[:256]',
      'dataset.shuffle_buffer': 64, 'dataset.eval_split': EVAL_SPLIT,
      'eval_batch_size': EVAL_BATCH, 'train_steps': TRAIN_STEPS, 'schedule.warmup_steps': 1,
      'checkpoint.every_steps': 2, 'checkpoint.async_save': False,
      'log_every_steps': TRAIN_STEPS,
      # Cheaper to compile, and nothing here depends on them: no gate noise (so no
      # load loss), plain SGD.
      'model.encoder.moe.router.noise_std': 0.0, 'optimizer.name': 'sgd',
      'optimizer.gradient_clip_norm': None, 'optimizer.weight_decay': 0.0})


def train(config, workdir) -> None:
  """A few steps of the trainer's own step on its training stream, on one device.

  The pieces of `trainer.train_and_evaluate` that make a workdir (its step function,
  optimizer, TrainState, checkpoint metadata, Checkpointer and config.json), without
  what these tests do not read (TensorBoard, metrics.jsonl, the final evaluation):
  about half the compile time.
  """
  from vmoe_sparse_ot import nn  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.train import optimizer, state, trainer  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.train import step as step_lib  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot import checkpoints
  model = nn.build_model(config.model)
  _, root_key = jax.random.split(jax.random.key(config.seed))
  # Parameters drawn with 'rbg' keys: threefry's initializers take 2 s longer to compile.
  init_key = jax.random.key(config.seed, impl='rbg')
  image = np.zeros((1, 28, 28, 1), np.float32)

  def init(key):
    return model.init({'params': key}, image, train=False)['params']

  abstract = jax.eval_shape(init, init_key)
  tx = optimizer.make_optimizer(
      config.optimizer, optimizer.make_schedule(config.schedule, config.train_steps), abstract)
  train_state = jax.jit(lambda key: state.create(init(key), tx, root_key))(init_key)
  step = jax.jit(step_lib.make_step(model, tx))
  batches = trainer._dataset(config, config.dataset.train_split, config.batch_size,  # pylint: disable=protected-access
                             training=True).as_numpy_iterator()
  meta = run_record.make(config, abstract)
  saver = checkpoints.Checkpointer(str(workdir), async_save=False)
  for t in range(1, config.train_steps + 1):
    train_state, _ = step(train_state, next(batches))
    if t % config.checkpoint.every_steps == 0:
      saver.save(t, train_state, dict(meta, step=t))
  saver.close()
  trainer._write_config(config, str(workdir))  # pylint: disable=protected-access


@pytest.fixture(scope='session')
def workdir(tmp_path_factory, request):
  """The trained workdir (config.json, checkpoints/2 and checkpoints/4), made once per run.

  Under pytest-xdist (scripts/test.sh) each worker has its own session; they share the
  run's base temporary directory, and the first to take the lock trains for all.
  """
  worker = getattr(request.config, 'workerinput', None)
  root = tmp_path_factory.getbasetemp()
  if worker is not None:
    root = root.parent  # The run's directory, shared by its workers.
  path = root / 'evaluate_workdir'
  with open(root / 'evaluate_workdir.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (path / 'config.json').exists():  # Written last: the workdir is complete.
      shutil.rmtree(path, ignore_errors=True)
      path.mkdir()
      train(tiny_config(), path)
  return path


@pytest.fixture(scope='session')
def eval_data():
  """(images (200, 28, 28, 1) float32, labels (200,)): the eval split, as the job reads it."""
  from vmoe_sparse_ot import data  # pylint: disable=g-import-not-at-top
  ds = data.make_dataset('embedded_mnist', EVAL_SPLIT, batch_size=EVAL_BATCH, image_size=28,
                         channels=1, training=False, process_index=0, process_count=1,
                         augment='none')
  images, labels = [], []
  for batch in ds.as_numpy_iterator():
    images.append(batch['image'][batch['mask']])
    labels.append(batch['label'][batch['mask']])
  return np.concatenate(images), np.concatenate(labels)


@pytest.fixture(scope='session')
def loaded(workdir):
  """`loaded(**overrides)`: `vmoe_sparse_ot.load(workdir, batch_size=64, **overrides)`, cached.

  Each distinct setting compiles once per session, whichever test asks first.
  """
  import vmoe_sparse_ot  # pylint: disable=g-import-not-at-top

  @functools.lru_cache(maxsize=None)
  def get(**overrides):
    return vmoe_sparse_ot.load(str(workdir), batch_size=EVAL_BATCH, **overrides)

  return get


# This project's names -> the reference V-MoE code's, written out from the table in
# docs/INITIALIZATION.md (not with `initialization.names`, which the reader uses).
_TO_REFERENCE = (
    (r'encoder/pos_embedding', r'Encoder/posembed_input/pos_embedding'),
    (r'encoder/encoder_norm/(.+)', r'Encoder/encoder_norm/\1'),
    (r'encoder/(encoderblock_\d+)/norm_att/(.+)', r'Encoder/\1/LayerNorm_0/\2'),
    (r'encoder/(encoderblock_\d+)/attention/(.+)', r'Encoder/\1/SelfAttention/\2'),
    (r'encoder/(encoderblock_\d+)/norm_mlp/(.+)', r'Encoder/\1/LayerNorm_1/\2'),
    (r'encoder/(encoderblock_\d+)/mlp/(Dense_[01]/.+)', r'Encoder/\1/Mlp/\2'),
    (r'encoder/(encoderblock_\d+)/moe/experts/wi_(kernel|bias)', r'Encoder/\1/Moe/Mlp/Dense_0/\2'),
    (r'encoder/(encoderblock_\d+)/moe/experts/wo_(kernel|bias)', r'Encoder/\1/Moe/Mlp/Dense_1/\2'),
    (r'encoder/(encoderblock_\d+)/moe/router/kernel', r'Encoder/\1/Moe/Router/dense/kernel'),
    (r'encoder/(encoderblock_\d+)/moe/router/(mu|scale)', r'Encoder/\1/Moe/Router/\2'),
    (r'(embedding|cls|pre_logits|head)(/.+)?', r'\g<0>'),
)
# What the config files below give: the model of the trained workdir.
CONFIG_TEXT = ('from tests.evaluate.conftest import tiny_config\n\n\n'
               'def get_config():\n  return tiny_config()\n')


def reference_name(name: str) -> str:
  import re  # pylint: disable=g-import-not-at-top
  for pattern, replacement in _TO_REFERENCE:
    m = re.fullmatch(pattern, name)
    if m:
      return m.expand(replacement)
  raise AssertionError(f'no reference name for {name}')


def write_released(params: dict, prefix: str) -> None:
  """`params` ({our name: array}) as a reference partitioned checkpoint at `prefix`, with
  tests/initialization/test_partitioned.py's own writer: two data shards, each
  expert array cut into one chunk per expert (alternating shards), as saved from a mesh."""
  from tests.initialization.test_partitioned import build, dump  # pylint: disable=g-import-not-at-top
  arrays = {reference_name(k): np.asarray(v) for k, v in params.items()}
  layout = {}
  for name, a in arrays.items():
    full = tuple((0, d) for d in a.shape)
    if '/Moe/Mlp/' in name:
      layout[name] = [(((e, e + 1),) + full[1:], e % 2) for e in range(a.shape[0])]
    else:
      layout[name] = [(full, 0)]
  index, shards = build(arrays, layout, 2)
  dump(prefix, index, shards)


@pytest.fixture(scope='session')
def released(workdir, tmp_path_factory):
  """(prefix, {our name: array}): the workdir's step-4 parameters, written as a reference
  V-MoE partitioned checkpoint (no workdir, no metadata) in its own folder."""
  from vmoe_sparse_ot import checkpoints  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.initialization import flatten_tree  # pylint: disable=g-import-not-at-top
  params, _, step = checkpoints.restore_params_with_meta(str(workdir))
  assert step == TRAIN_STEPS
  flat = {k: np.asarray(jax.device_get(v)) for k, v in flatten_tree(params).items()}
  prefix = str(tmp_path_factory.mktemp('released') / 'vmoe_tiny')
  write_released(flat, prefix)
  return prefix, flat
