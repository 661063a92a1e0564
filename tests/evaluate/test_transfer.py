"""evaluate.transfer: the few-shot protocol, its evaluator and the periodic action."""
import flax.linen as flax_nn
import jax
import numpy as np
import pytest
from clu import metric_writers

from tests.evaluate.helpers import LinearModel, batches, clusters, image_data
from vmoe_sparse_ot.evaluate import transfer

L2_REGS = tuple(2.0**k for k in range(-10, 20))


def _gaussians(seed, noise=0.1):
  return clusters(seed, num_classes=5, per_class=30, dim=16, noise=noise)


def _protocol(**overrides):
  kwargs = dict(num_classes=5, shots=(1, 5, 10), seeds=(0, 1), l2_regs=L2_REGS)
  kwargs.update(overrides)
  return kwargs


@pytest.mark.parametrize('l2_selection', ['loo', 'holdout'])
def test_linearly_separable_features_reach_accuracy_one(l2_selection):
  train_x, train_y = _gaussians(0)
  test_x, test_y = _gaussians(1)
  results = transfer.evaluate_features(train_x, train_y, test_x, test_y,
                                      **_protocol(l2_selection=l2_selection))
  assert sorted(results) == [1, 5, 10]
  for r in results.values():
    assert r['accuracy_mean'] >= 0.99
    assert len(r['accuracy']) == len(r['l2_reg']) == 2 and r['seeds'] == [0, 1]
    assert all(lam in L2_REGS for lam in r['l2_reg'])
    assert r['accuracy_std'] == pytest.approx(np.std(r['accuracy']))


class _LabelsGuard:
  """Test labels that raise on any access until released for scoring."""

  def __init__(self, labels):
    self._labels = labels

  def __getattr__(self, name):
    raise AssertionError(f'test labels read during selection ({name})')

  def __array__(self, *args, **kwargs):
    raise AssertionError('test labels read during selection (__array__)')

  def __len__(self):
    raise AssertionError('test labels read during selection (__len__)')


@pytest.mark.parametrize('l2_selection', ['loo', 'holdout'])
def test_l2_selection_never_reads_test_labels(monkeypatch, l2_selection):
  train_x, train_y = _gaussians(2, noise=2.0)  # noisy: the choice of L2 matters
  test_x, test_y = _gaussians(3, noise=2.0)
  kwargs = _protocol(l2_selection=l2_selection, shots=(1, 2, 10), seeds=(0, 1, 2))
  honest = transfer.evaluate_features(train_x, train_y, test_x, test_y, **kwargs)

  # 1. Test labels can only be read by the scoring step, which runs after the fit.
  real_top1 = transfer._top1
  scored = []

  def top1(predictions, labels):
    assert isinstance(labels, _LabelsGuard)
    scored.append(len(predictions))
    return real_top1(predictions, labels._labels)

  with monkeypatch.context() as patch:
    patch.setattr(transfer, '_top1', top1)
    guarded = transfer.evaluate_features(train_x, train_y, test_x, _LabelsGuard(test_y),
                                        **kwargs)
  assert scored == [len(test_y)] * (3 * 3)
  assert guarded == honest

  # 2. Corrupted test labels change the accuracy but not the chosen L2 strengths.
  corrupted = transfer.evaluate_features(
      train_x, train_y, test_x, np.random.default_rng(0).permutation(test_y), **kwargs)
  for shot in honest:
    assert corrupted[shot]['l2_reg'] == honest[shot]['l2_reg']
    assert corrupted[shot]['accuracy'] != honest[shot]['accuracy']
  # The choice is a real one: not every (shot, seed) lands on the same strength.
  assert len({lam for r in honest.values() for lam in r['l2_reg']}) > 1


def test_chunked_prediction_matches_full_prediction():
  train_x, train_y = _gaussians(4, noise=2.0)
  test_x, _ = _gaussians(5, noise=2.0)
  fit = transfer.ridge.fit(train_x, train_y, num_classes=5, l2_regs=L2_REGS)
  np.testing.assert_array_equal(transfer._predict(fit, test_x, chunk=7),
                                np.argmax(fit.predict(test_x), axis=1))


def test_sample_few_shot_draws_shot_distinct_examples_per_class():
  labels = np.repeat(np.arange(4), [3, 5, 7, 9])
  idx = transfer.sample_few_shot(labels, 3, seed=0, num_classes=4)
  assert len(set(idx.tolist())) == 12
  np.testing.assert_array_equal(np.bincount(labels[idx]), [3, 3, 3, 3])
  np.testing.assert_array_equal(idx, transfer.sample_few_shot(labels, 3, 0, 4))
  assert not np.array_equal(idx, transfer.sample_few_shot(labels, 3, 1, 4))
  with pytest.raises(ValueError, match='Class 0 has 3 training examples, fewer than shot=4'):
    transfer.sample_few_shot(labels, 4, 0, 4)


# --- The evaluator, with a tiny contract-conforming model.


def _evaluator(**kwargs):
  model = LinearModel()
  train_images, train_labels = image_data(1, 30)
  test_images, test_labels = image_data(2, 20)
  ds = transfer.FewShotDataset('toy', 'train', 'test', 3, batches(train_images, train_labels, 8),
                              batches(test_images, test_labels, 8))
  evaluator = transfer.FewShotEvaluator(
      model, {'toy': ds}, shots=(1, 2), seeds=(0, 1), l2_regs=L2_REGS, **kwargs)
  params = model.init(jax.random.key(0), train_images[:1], False)['params']
  return evaluator, params


def test_evaluator_reports_metrics_per_dataset_and_shot():
  evaluator, params = _evaluator()
  results = evaluator.run(params)
  assert results['toy']['num_train'] == 30 and results['toy']['num_test'] == 20
  metrics = evaluator(params)
  assert sorted(metrics) == ['fewshot/toy/1shot', 'fewshot/toy/2shot']
  assert all(v == pytest.approx(1.0) for v in metrics.values())


class _RecordingWriter(metric_writers.MetricWriter):
  """A CLU MetricWriter that keeps what it is given."""

  def __init__(self):
    self.scalars = []

  def write_summaries(self, step, values, metadata=None):
    pass

  def write_scalars(self, step, scalars):
    self.scalars.append((step, dict(scalars)))

  def write_images(self, step, images):
    pass

  def write_videos(self, step, videos):
    pass

  def write_audios(self, step, audios, *, sample_rate):
    pass

  def write_texts(self, step, texts):
    pass

  def write_histograms(self, step, arrays, num_buckets=None):
    pass

  def write_hparams(self, hparams):
    pass

  def flush(self):
    pass

  def close(self):
    pass


def test_periodic_action_writes_metrics_on_first_every_and_last_step():
  evaluator, params = _evaluator()
  writer = _RecordingWriter()
  action = transfer.PeriodicFewShot(evaluator, writer, every_steps=4, last_step=10)
  returned = {step: action(step, params) for step in range(1, 11)}
  assert [s for s, _ in writer.scalars] == [1, 4, 8, 10]
  assert [s for s, m in returned.items() if m is not None] == [1, 4, 8, 10]
  for _, scalars in writer.scalars:
    assert sorted(scalars) == ['fewshot/toy/1shot', 'fewshot/toy/2shot']
  # A resumed run evaluates on its first call too.
  resumed = transfer.PeriodicFewShot(evaluator, writer, every_steps=4, last_step=10)
  assert resumed.should_run(6) and resumed(6, params) is not None and not resumed.should_run(7)
  with pytest.raises(ValueError, match='every_steps'):
    transfer.PeriodicFewShot(evaluator, writer, every_steps=0, last_step=10)


def test_periodic_action_writes_to_a_clu_summary_writer(tmp_path):
  from tensorboard.backend.event_processing import event_accumulator
  evaluator, params = _evaluator()
  writer = metric_writers.create_default_writer(str(tmp_path), asynchronous=False)
  action = transfer.PeriodicFewShot(evaluator, writer, every_steps=100, last_step=3)
  for step in (1, 2, 3):
    action(step, params)
  writer.flush()
  acc = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={'tensors': 0})
  acc.Reload()
  tags = acc.Tags()['tensors'] + acc.Tags()['scalars']
  assert 'fewshot/toy/1shot' in tags
  events = (acc.Tensors('fewshot/toy/1shot') if 'fewshot/toy/1shot' in acc.Tags()['tensors']
            else acc.Scalars('fewshot/toy/1shot'))
  assert [e.step for e in events] == [1, 3]


def test_evaluator_rejects_bad_protocol():
  with pytest.raises(ValueError, match='l2_selection'):
    _evaluator(l2_selection='test')


class _Identity(flax_nn.Module):
  """Pre-logit features = the flattened image."""

  @flax_nn.compact
  def __call__(self, images, train):
    del train
    x = images.reshape(images.shape[0], -1)
    return flax_nn.Dense(3, name='head')(x), {'pre_logits': x}


def _brute_force_reference(data, shots, seeds, l2_regs):
  """The reference's rule written out with scikit-learn's ridge: every L2 fitted on the
  few-shot draw (its design: features centred and divided by std + 1e-5, a column of
  100 for the bias; targets in {-1, 1}, every weight penalised) and scored on the
  test split; per shot, each dataset and seed
  ranks the L2s by accuracy (0: worst; ties in grid order), and the L2 of best mean
  rank (the first of ties) is reported for all. -> ({shot: L2}, {(key, shot, seed):
  accuracy per L2})."""
  from sklearn.linear_model import Ridge  # pylint: disable=import-outside-toplevel
  grids, chosen = {}, {}
  for shot in shots:
    rank_rows = []
    for key, (tr_x, tr_y, te_x, te_y) in data.items():
      for seed in seeds:
        idx = transfer.sample_few_shot(tr_y, shot, seed, 3)
        x, y = tr_x[idx].astype(np.float64), tr_y[idx]
        mean, std = x.mean(0), x.std(0) + 1e-5
        design = lambda f, mean=mean, std=std: np.hstack([(f - mean) / std,
                                                          np.full((len(f), 1), 100.0)])
        targets = np.where(y[:, None] == np.arange(3), 1.0, -1.0)
        accs = []
        for lam in l2_regs:
          model = Ridge(alpha=lam, fit_intercept=False, solver='svd').fit(design(x), targets)
          accs.append(np.mean(np.argmax(model.predict(design(te_x)), 1) == te_y))
        grids[key, shot, seed] = accs
        rank_rows.append([sum(a < accs[j] for a in accs) + sum(a == accs[j] for a in accs[:j])
                          for j in range(len(accs))])
    mean_rank = np.mean(rank_rows, axis=0)
    chosen[shot] = l2_regs[int(np.flatnonzero(mean_rank == mean_rank.max())[0])]
  return chosen, grids


def test_reference_l2_selection_matches_a_brute_force_re_implementation():
  """Two datasets that alone pick different L2s: 'reference' reports one per shot."""
  l2_regs = (1e-3, 0.1, 1.0, 10.0, 100.0, 1e4)
  shots, seeds = (1, 3), (0, 1)
  data, datasets = {}, {}
  for key, (seed, noise) in {'clean': (5, 0.6), 'noisy': (6, 2.5)}.items():
    patterns = np.random.default_rng(99).normal(size=(3, 2, 2, 2))
    rng = np.random.default_rng(seed)
    tr_y, te_y = np.repeat(np.arange(3), 8), rng.integers(0, 3, size=40)
    tr_x = (patterns[tr_y] + noise * rng.normal(size=(24, 2, 2, 2))).astype(np.float32)
    te_x = (patterns[te_y] + noise * rng.normal(size=(40, 2, 2, 2))).astype(np.float32)
    data[key] = (tr_x.reshape(24, -1), tr_y, te_x.reshape(40, -1), te_y)
    datasets[key] = transfer.FewShotDataset(key, 'train', 'test', 3, batches(tr_x, tr_y, 8),
                                            batches(te_x, te_y, 8))
  model = _Identity()
  params = model.init(jax.random.key(0), data['clean'][0][:1].reshape(1, 2, 2, 2),
                      False)['params']
  evaluator = transfer.FewShotEvaluator(model, datasets, shots=shots, seeds=seeds,
                                        l2_regs=l2_regs, l2_selection='reference')
  results = evaluator.run(params)
  chosen, grids = _brute_force_reference(data, shots, seeds, l2_regs)
  for key in data:
    for shot in shots:
      r = results[key]['shots'][shot]
      assert r['l2_reg'] == [chosen[shot]] * 2
      np.testing.assert_allclose(r['accuracy_per_l2'], [grids[key, shot, s] for s in seeds])
      want = [grids[key, shot, s][l2_regs.index(chosen[shot])] for s in seeds]
      np.testing.assert_allclose(r['accuracy'], want)
      assert r['accuracy_mean'] == pytest.approx(np.mean(want))
  # Each dataset alone picks another L2 for some shot: the choice is shared.
  alone = {key: transfer.evaluate_features(*data[key], num_classes=3, shots=shots,
                                           seeds=seeds, l2_regs=l2_regs,
                                           l2_selection='reference') for key in data}
  assert any(alone['clean'][s]['l2_reg'] != alone['noisy'][s]['l2_reg'] for s in shots)
  assert evaluator.protocol['l2_selection'] == 'reference'


def test_make_evaluator_preprocesses_the_fewshot_images_with_config_fewshot_pp():
  """config.fewshot.pp (the reference's fewshot.process) replaces the default resize:
  the evaluator reads what data.make_dataset gives with that pp string, and its
  ridge runs on those features."""
  from vmoe_sparse_ot import data  # pylint: disable=import-outside-toplevel
  from vmoe_sparse_ot.config import schema  # pylint: disable=import-outside-toplevel
  pp = 'decode(1)|resize(12)|central_crop(8)|value_range(-1, 1)|keep("image", "label")'
  config = schema.base_config()
  config.dataset.image_size, config.dataset.channels = 8, 1
  config.fewshot.datasets = {'digits': {'name': 'sklearn_digits', 'train_split': 'train',
                                        'test_split': 'test'}}
  config.fewshot.shots, config.fewshot.seeds, config.fewshot.batch_size = (2,), (0,), 128

  def first_batch(evaluator):
    return next(iter(evaluator.datasets['digits'].train.as_numpy_iterator()))['image']

  default = first_batch(transfer.make_evaluator(config, _Identity()))
  config.fewshot.pp = pp
  evaluator = transfer.make_evaluator(config, _Identity())
  want = next(iter(data.make_dataset('sklearn_digits', 'train', batch_size=128, image_size=8,
                                     channels=1, training=False, pp=pp).as_numpy_iterator()))
  np.testing.assert_array_equal(first_batch(evaluator), want['image'])
  assert not np.allclose(first_batch(evaluator), default)   # A 1.5x zoom, not a resize.
  params = _Identity().init(jax.random.key(0), np.zeros((1, 8, 8, 1), np.float32),
                            False)['params']
  accuracy = evaluator(params)['fewshot/digits/2shot']
  assert 0.3 < accuracy <= 1.0   # 2-shot ridge on 64 pixels of 10 digit classes.
