"""Input pipeline: eval padding/mask, per-process layout, resume position and cost, shapes."""
import numpy as np
import pytest

from vmoe_sparse_ot import data
from vmoe_sparse_ot.data import pipeline
from vmoe_sparse_ot.data import records
from vmoe_sparse_ot.data import sampling

MNIST = dict(image_size=28, channels=1)


def _eval_batches(split, batch_size, process_count, name='embedded_mnist', **kw):
  out = []
  for p in range(process_count):
    ds = data.make_dataset(name, split, batch_size=batch_size, training=False,
                           process_index=p, process_count=process_count, **kw)
    out.append(list(ds.as_numpy_iterator()))
  return out


@pytest.mark.parametrize('batch_size,process_count', [(64, 1), (7, 1), (24, 2), (5, 3)])
def test_eval_counts_every_example_exactly_once(batch_size, process_count):
  # 'test[:1000]' is not a multiple of any global batch here except 24*2 ... nor 64.
  per_process = _eval_batches('test[:1000]', batch_size, process_count, **MNIST)
  counts = [len(b) for b in per_process]
  assert len(set(counts)) == 1, f'processes disagree on the number of batches: {counts}'
  # Rebuild the global batches in order and compare with the unsharded stream.
  rows = []
  for t in range(counts[0]):
    batch = {k: np.concatenate([per_process[p][t][k] for p in range(process_count)])
             for k in ('image', 'label', 'mask')}
    assert batch['mask'].shape == (batch_size * process_count,)
    rows.append(batch)
  mask = np.concatenate([r['mask'] for r in rows])
  labels = np.concatenate([r['label'] for r in rows])
  images = np.concatenate([r['image'] for r in rows])
  assert mask.sum() == 1000
  # Real examples first, padding (zeros) only at the end of the global stream.
  assert mask[:1000].all() and not mask[1000:].any()
  assert len(mask) - 1000 < batch_size * process_count
  assert (images[1000:] == 0).all() and (labels[1000:] == 0).all()
  reference = [b for b in data.make_dataset(
      'embedded_mnist', 'test[:1000]', batch_size=1000, training=False,
      process_index=0, process_count=1, **MNIST).as_numpy_iterator()]
  np.testing.assert_array_equal(labels[:1000], reference[0]['label'])
  np.testing.assert_array_equal(images[:1000], reference[0]['image'])


@pytest.mark.parametrize('sampling', ['index', 'stream'])
def test_train_stream_layout_is_process_count_invariant_and_resumable(sampling):
  kw = dict(training=True, shuffle_seed=3, shuffle_buffer=500, sampling=sampling, **MNIST)
  one = data.make_dataset('embedded_mnist', 'train[:2000]', batch_size=32,
                          process_index=0, process_count=1, **kw).as_numpy_iterator()
  batches = [next(one) for _ in range(5)]
  assert batches[0]['image'].shape == (32, 28, 28, 1)
  assert batches[0]['image'].dtype == np.float32 and batches[0]['label'].dtype == np.int32
  assert 'mask' not in batches[0]
  assert -1.0 <= batches[0]['image'].min() and batches[0]['image'].max() <= 1.0
  assert not np.array_equal(batches[0]['label'], batches[1]['label'])
  # Resume at step 3: same batch as the uninterrupted stream.
  resumed = data.make_dataset('embedded_mnist', 'train[:2000]', batch_size=32, process_index=0,
                              process_count=1, start_step=3, **kw).as_numpy_iterator()
  np.testing.assert_array_equal(next(resumed)['image'], batches[3]['image'])
  # Two processes of 16 make up exactly the same global batches, rows in order.
  halves = [data.make_dataset('embedded_mnist', 'train[:2000]', batch_size=16, process_index=p,
                              process_count=2, start_step=3, **kw).as_numpy_iterator()
            for p in range(2)]
  got = [next(h) for h in halves]
  np.testing.assert_array_equal(np.concatenate([g['label'] for g in got]), batches[3]['label'])
  np.testing.assert_array_equal(np.concatenate([g['image'] for g in got]), batches[3]['image'])


def test_augmentation_resize_and_channels_on_digits():
  ds = data.make_dataset('sklearn_digits', 'train', batch_size=8, image_size=16, channels=3,
                         training=True, augment='inception_crop_flip', process_index=0,
                         process_count=1)
  a = next(ds.as_numpy_iterator())
  assert a['image'].shape == (8, 16, 16, 3)
  # Grey input converted to RGB: the three channels are equal.
  np.testing.assert_allclose(a['image'][..., 0], a['image'][..., 2])
  # Deterministic: a second pipeline with the same seed gives the same batch.
  b = next(data.make_dataset('sklearn_digits', 'train', batch_size=8, image_size=16, channels=3,
                             training=True, augment='inception_crop_flip', process_index=0,
                             process_count=1).as_numpy_iterator())
  np.testing.assert_array_equal(a['image'], b['image'])
  assert data.num_classes('sklearn_digits') == 10
  assert data.num_examples('sklearn_digits', 'train') + data.num_examples(
      'sklearn_digits', 'test') == 1797


DIGITS = dict(batch_size=8, process_index=0, process_count=1)


def test_pp_strings_drive_the_pipeline_and_eval_pads_every_entry():
  onehot = "onehot(10, key='label', key_result='labels', on=0.91, off=0.01)"
  train = next(data.make_dataset(
      'sklearn_digits', 'train', image_size=8, channels=1, training=True,
      pp=f'decode(channels=1)|random_crop(6)|resize(8)|flip_lr|value_range(-1, 1)|{onehot}',
      **DIGITS).as_numpy_iterator())
  assert train['image'].shape == (8, 8, 8, 1) and train['image'].dtype == np.float32
  assert train['labels'].shape == (8, 10) and train['label'].dtype == np.int32
  np.testing.assert_allclose(train['labels'].sum(-1), 1.0, rtol=1e-6)
  np.testing.assert_array_equal(train['labels'].argmax(-1), train['label'])
  assert set(train) == {'image', 'label', 'labels'}  # The seed entry is gone.
  # 'test[:12]' in batches of 8: the second batch holds 4 padding rows of zeros.
  batches = list(data.make_dataset(
      'sklearn_digits', 'test[:12]', image_size=16, channels=3, training=False,
      pp=f'decode|resize(16)|value_range(-1, 1)|{onehot}', **DIGITS).as_numpy_iterator())
  assert [b['mask'].sum() for b in batches] == [8, 4]
  assert batches[0]['image'].shape == (8, 16, 16, 3)
  assert (batches[1]['labels'][4:] == 0).all() and (batches[1]['image'][4:] == 0).all()


def test_augment_modes_are_pp_strings():
  assert data.pipeline.legacy_pp('none', image_size=28, channels=1, training=True,
                                 stored_shape=(28, 28, 1)) == (
                                     'decode(channels=1)|value_range(-1, 1)')
  assert data.pipeline.legacy_pp('inception_crop_flip', image_size=224, channels=3,
                                 training=False) == (
      "decode(channels=3)|resize_small(256, method='bilinear', antialias=True)|"
      'central_crop(224)|value_range(-1, 1)')
  train = data.pipeline.legacy_pp('inception_crop_flip', image_size=224, channels=3,
                                  training=True)
  assert train.startswith('decode(channels=3)|inception_crop(224, area_min=8, ')
  assert train.endswith('|flip_lr|value_range(-1, 1)')
  # The tiny MNIST config's strings are the 'none' mode's, with a resize that follows
  # image_size (the identity at the stored 28 px).
  from vmoe_sparse_ot.config import files  # pylint: disable=g-import-not-at-top
  config = files.load_config_file('configs/vmoe_tiny_mnist.py')
  assert config.dataset.pp_train == config.dataset.pp_eval == (
      'decode(channels=1)|resize(28)|value_range(-1, 1)') and config.dataset.augment is None


def test_bad_arguments_fail_clearly():
  with pytest.raises(ValueError, match='augment'):
    data.make_dataset('sklearn_digits', 'train', batch_size=8, image_size=8, channels=1,
                      training=True, augment='mixup', process_index=0, process_count=1)
  with pytest.raises(ValueError, match=r"^augment='none' and pp='decode': give one"):
    data.make_dataset('sklearn_digits', 'train', image_size=8, channels=1, training=True,
                      augment='none', pp='decode', **DIGITS)
  with pytest.raises(ValueError, match=r"^pp='decode\|flip_lr': op 'flip_lr' is random"):
    data.make_dataset('sklearn_digits', 'test', image_size=8, channels=1, training=False,
                      pp='decode|flip_lr', **DIGITS)
  with pytest.raises(ValueError, match=r"gives 'image' float32 of shape \(6, 6, 1\); the "
                     r'model reads float32 \(8, 8, 1\)'):
    data.make_dataset('sklearn_digits', 'test', image_size=8, channels=1, training=False,
                      pp='decode(channels=1)|central_crop(6)|value_range(-1, 1)', **DIGITS)
  with pytest.raises(ValueError, match='neither embedded'):
    data.make_dataset('no_such_dataset_xyz', 'train', batch_size=8, image_size=8, channels=1,
                      training=True, process_index=0, process_count=1)


# Digits without augmentation: a training row is its record's image, unchanged.
PLAIN = dict(image_size=8, channels=1, pp='decode(channels=1)|value_range(-1, 1)')


def _train(split, start_step=0, batch_size=8, process_index=0, process_count=1):
  return data.make_dataset('sklearn_digits', split, batch_size=batch_size, training=True,
                           shuffle_seed=4, process_index=process_index,
                           process_count=process_count, start_step=start_step,
                           **PLAIN).as_numpy_iterator()


def _records_in_order(split):
  """(images, labels) of `split` in record order (the evaluation pass)."""
  (batch,) = data.make_dataset('sklearn_digits', split, batch_size=4096, training=False,
                               process_index=0, process_count=1, **PLAIN).as_numpy_iterator()
  return batch['image'][batch['mask']], batch['label'][batch['mask']]


@pytest.fixture
def records_read():
  """A one-entry list: the records that `SplitRecords.read` returned so far."""
  with records.counting_reads() as count:
    yield count


def test_processes_read_disjoint_records_whose_union_is_the_epoch():
  # 'train[:96]' in global batches of 2 x 8: one epoch is 6 steps.
  images, _ = _records_in_order('train[:96]')
  rows = [np.concatenate([next(it)['image'] for _ in range(6)])
          for it in [_train('train[:96]', process_index=p, process_count=2) for p in range(2)]]
  got = np.concatenate(rows).reshape(96, -1)
  # Equal as multisets of images: every record exactly once over both processes.
  key = lambda a: a[np.lexsort(a.T[::-1])]  # noqa: E731
  np.testing.assert_array_equal(key(got), key(images.reshape(96, -1)))


def test_restart_at_a_late_step_gives_the_uninterrupted_batches(records_read):
  # 'train[:40]' in batches of 8: 5 steps an epoch, so 12 steps cross two epochs.
  it = _train('train[:40]')
  whole = [next(it) for _ in range(12)]
  for step in (6, 11):
    resumed = next(_train('train[:40]', start_step=step))
    np.testing.assert_array_equal(resumed['image'], whole[step]['image'])
    np.testing.assert_array_equal(resumed['label'], whole[step]['label'])
  # At step 10**12 the batch holds the records the index arithmetic names, and
  # reading it took a few batches' worth of records (the read-ahead), not 10**12.
  images, labels = _records_in_order('train[:40]')
  step = 10**12
  records_read[0] = 0
  late = next(_train('train[:40]', start_step=step))
  expected = sampling.record_indices(np.arange(step * 8, (step + 1) * 8), 40, seed=4)
  np.testing.assert_array_equal(late['label'], labels[expected])
  np.testing.assert_array_equal(late['image'], images[expected])
  assert 8 <= records_read[0] <= 16 * 8, records_read


def test_restart_cost_does_not_depend_on_the_step(records_read):
  for step in (0, 10**3, 10**9):
    records_read[0] = 0
    next(_train('train', start_step=step, process_index=1, process_count=2))
    # The first batch and the pipeline's read-ahead (a few batches), whatever the step;
    # the 'stream' sampling skipped step * 16 records through its shuffle buffer.
    assert 8 <= records_read[0] <= 16 * 8, (step, records_read)


def test_trace_pp_checks_the_output_size_against_the_stored_images():
  """A pp string without a resize gives the stored size: caught while tracing, fix named."""
  stored = data.image_shape('sklearn_digits')
  assert stored == (8, 8, 1)
  bare = 'decode(channels=1)|value_range(-1, 1)'
  # Without the stored shape the traced output is (None, None, 1): it cannot be known.
  data.trace_pp(bare, training=False, image_size=35, channels=1)
  with pytest.raises(ValueError) as e:
    data.trace_pp(bare, training=False, image_size=35, channels=1, stored_shape=stored)
  message = str(e.value)
  assert '\n' not in message
  assert "gives 'image' of shape (8, 8, 1)" in message and '(35, 35, 1)' in message
  assert "'decode(channels=1)|resize(35)|value_range(-1, 1)'" in message
  # The fix it names passes, in training (random ops seeded) and evaluation.
  fixed = 'decode(channels=1)|resize(35)|value_range(-1, 1)'
  for training in (True, False):
    out = data.trace_pp(fixed, training=training, image_size=35, channels=1,
                        stored_shape=stored)
    assert tuple(out['image'].shape) == (35, 35, 1)
  # A crop to the size is as good as a resize.
  data.trace_pp('decode(channels=1)|resize(40)|central_crop(35)|value_range(-1, 1)',
                training=False, image_size=35, channels=1, stored_shape=stored)
  # Stored images of varying size need a resize or a crop (none here): refused too.
  with pytest.raises(ValueError, match=r'add resize\(35\) after decode'):
    data.trace_pp(bare, training=False, image_size=35, channels=1,
                  stored_shape=(None, None, 1))


def _real_label_toy(data_dir):
  """A TFDS dataset of four 8x8 images with a multi-label feature, as ImageNet ReaL's."""
  import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel

  class RealLabelToy(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    VERSION = tfds.core.Version('1.0.0')

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
          'image': tfds.features.Image(shape=(8, 8, 3)),
          'label': tfds.features.ClassLabel(num_classes=4),
          'real_label': tfds.features.Sequence(tfds.features.ClassLabel(num_classes=4))}))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {'test': self._generate_examples()}

    def _generate_examples(self):
      for i, real in enumerate(REAL_LABELS):
        yield i, {'image': np.full((8, 8, 3), 10 * i, np.uint8), 'label': 3 - i,
                  'real_label': real}

  builder = RealLabelToy(data_dir=str(data_dir))
  builder.download_and_prepare()
  return builder


REAL_LABELS = ([1], [0, 2], [], [3])


@pytest.mark.parametrize('sampling_mode', ['index', 'stream'])
def test_a_label_key_feature_is_read_under_its_own_name_too(tmp_path, monkeypatch,
                                                             sampling_mode):
  """label_key='real_label': a pp written for the reference code reads the feature by
  its name (onehot(4, inkey="real_label")), as one written for this project reads it
  as 'label'; both give the same multi-hot labels."""
  builder = _real_label_toy(tmp_path)
  monkeypatch.setattr(pipeline, 'get_builder', lambda name, data_dir=None: builder)
  want = np.array([[0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 1]], np.float32)
  for inkey in ('real_label', 'label'):
    pp = f'decode|value_range(0, 1)|onehot(4, inkey="{inkey}", outkey="labels")|keep("image", "labels")'
    assert set(data.trace_pp(pp, training=False, image_size=8, channels=3, label_shape=(None,),
                             stored_shape=(8, 8, 3), label_key='real_label')) == {
                                 'image', 'labels'}
    ds = data.make_dataset('real_label_toy', 'test', batch_size=4, image_size=8, channels=3,
                           training=False, process_index=0, process_count=1, pp=pp,
                           label_key='real_label', sampling=sampling_mode)
    (batch,) = list(ds.as_numpy_iterator())
    # TFDS stores the records in its own order: example i is the image of value 10 i.
    order = np.round(batch['image'][:, 0, 0, 0] * 255 / 10).astype(int)
    assert sorted(order) == [0, 1, 2, 3]
    np.testing.assert_array_equal(batch['labels'], want[order])
