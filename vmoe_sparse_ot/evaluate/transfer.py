"""Few-shot linear transfer of frozen pre-logit features, periodic or standalone.

Protocol, per dataset of `config.fewshot.datasets`:
1. Extract the pre-logit features (`aux['pre_logits']`) of the train and test
   splits once per evaluation (`features.py`; batch split over the mesh given one).
2. For every shot count and seed: draw `shot` random examples per class from the
   train-split features (`np.random.default_rng(seed)`), fit the closed-form ridge
   classifier for the whole L2 grid and choose the L2 strength on those few-shot
   examples only (`ridge.py`: leave-one-out by default, or a per-class holdout),
   then measure top-1 accuracy on the full test split with the chosen strength.
   Test labels are read only to score a finished fit.
3. Report per shot the accuracy of each seed with its chosen L2, and their mean and
   (population) standard deviation over seeds. Training logs the mean as
   `fewshot/<dataset>/<shot>shot`.

`l2_selection='reference'` replaces step 2's choice by the reference V-MoE code's,
to compare with its published numbers: every strength is fitted on the few-shot
examples and scored on the test split; per shot, the strength of best mean rank
over every dataset and seed evaluated together (`ridge.reference_l2_index`) is
reported for all of them. It selects on the test split, as the reference does;
each shot's results then hold `accuracy_per_l2` (per seed, per strength).
"""
from typing import Any, Mapping, NamedTuple, Sequence

import jax
import ml_collections
import numpy as np
from absl import logging

from vmoe_sparse_ot import data
from vmoe_sparse_ot.config import fewshot_section as fewshot_config
from vmoe_sparse_ot.evaluate import features as features_lib
from vmoe_sparse_ot.evaluate import ridge
from vmoe_sparse_ot.config.fewshot_section import default_fewshot_config, transfer_datasets

__all__ = [
    'DatasetError', 'FewShotDataset', 'FewShotEvaluator', 'PeriodicFewShot',
    'default_fewshot_config', 'evaluate_features', 'make_evaluator', 'metric_name',
    'metrics_from_results', 'sample_few_shot', 'transfer_datasets',
]


class DatasetError(ValueError):
  """A few-shot dataset named in the config cannot be loaded."""


def metric_name(dataset: str, shot: int) -> str:
  return f'fewshot/{dataset}/{shot}shot'


def sample_few_shot(labels: np.ndarray, shot: int, seed: int, num_classes: int) -> np.ndarray:
  """Indices of `shot` distinct random examples of every class in [0, num_classes)."""
  rng = np.random.default_rng(seed)
  indices = []
  for c in range(num_classes):
    idx = np.flatnonzero(labels == c)
    if len(idx) < shot:
      raise ValueError(f'Class {c} has {len(idx)} training examples, fewer than shot={shot}.')
    indices.append(rng.choice(idx, size=shot, replace=False))
  return np.concatenate(indices)


def _predict(fit: ridge.RidgeFit, features: np.ndarray, chunk: int = 8192) -> np.ndarray:
  """(M,) predicted classes, in chunks so (M, c) float64 scores never sit in memory."""
  return np.concatenate([np.argmax(fit.predict(features[i:i + chunk]), axis=1)
                         for i in range(0, len(features), chunk)])


def _top1(predictions: np.ndarray, labels) -> float:
  """The only place evaluation reads test labels: after the fit, to score it."""
  return float(np.mean(predictions == np.asarray(labels)))


def evaluate_features(train_features: np.ndarray, train_labels: np.ndarray,
                      test_features: np.ndarray, test_labels, *, num_classes: int,
                      shots: Sequence[int], seeds: Sequence[int], l2_regs: Sequence[float],
                      l2_selection: str = 'loo', holdout_fraction: float = 0.2) -> dict:
  """Few-shot ridge transfer on precomputed features.

  Args:
    train_features, train_labels: (N, D') and (N,) of the split shots are drawn from.
    test_features, test_labels: (M, D') and (M,) of the split accuracy is measured on.
    num_classes, shots, seeds, l2_regs, l2_selection, holdout_fraction: as in
      `default_fewshot_config()`.

  Returns:
    `{shot: {'accuracy_mean', 'accuracy_std', 'accuracy': [per seed],
    'l2_reg': [chosen per seed], 'seeds': [...]}}`.
  """
  if not seeds:
    raise ValueError('seeds must name at least one seed.')
  if l2_selection == 'reference':
    return _reference_results([{
        int(shot): _accuracy_per_l2(train_features, train_labels, test_features,
                                    test_labels, num_classes, shot, seeds, l2_regs)
        for shot in shots}], l2_regs)[0]
  results = {}
  for shot in shots:
    accuracies, chosen = [], []
    for seed in seeds:
      idx = sample_few_shot(train_labels, shot, seed, num_classes)
      fit = ridge.fit(train_features[idx], train_labels[idx], num_classes=num_classes,
                      l2_regs=l2_regs, selection=l2_selection,
                      holdout_fraction=holdout_fraction, seed=seed)
      accuracies.append(_top1(_predict(fit, test_features), test_labels))
      chosen.append(fit.l2_reg)
    results[int(shot)] = {
        'accuracy_mean': float(np.mean(accuracies)),
        'accuracy_std': float(np.std(accuracies)),
        'accuracy': accuracies,
        'l2_reg': chosen,
        'seeds': [int(s) for s in seeds],
    }
  return results


def _accuracy_per_l2(train_features, train_labels, test_features, test_labels, num_classes,
                     shot, seeds, l2_regs) -> dict:
  """{'accuracy_per_l2': [per seed: test top-1 of each strength], 'seeds'}."""
  grid = []
  for seed in seeds:
    idx = sample_few_shot(train_labels, shot, seed, num_classes)
    fits = ridge.fit_each(train_features[idx], train_labels[idx], num_classes=num_classes,
                          l2_regs=l2_regs, design='reference')
    grid.append([_top1(_predict(fit, test_features), test_labels) for fit in fits])
  return {'accuracy_per_l2': grid, 'seeds': [int(s) for s in seeds]}


def _reference_results(per_dataset: Sequence[dict], l2_regs: Sequence[float]) -> list[dict]:
  """Per dataset `{shot: results}` at the reference's L2 of each shot, chosen over the
  `accuracy_per_l2` of every dataset and seed together."""
  out = [{} for _ in per_dataset]
  for shot in per_dataset[0]:
    best = ridge.reference_l2_index(
        [row for shots in per_dataset for row in shots[shot]['accuracy_per_l2']])
    for results, shots in zip(out, per_dataset):
      r = shots[shot]
      accuracies = [float(row[best]) for row in r['accuracy_per_l2']]
      results[shot] = {
          'accuracy_mean': float(np.mean(accuracies)),
          'accuracy_std': float(np.std(accuracies)),
          'accuracy': accuracies,
          'l2_reg': [float(l2_regs[best])] * len(accuracies),
          'seeds': r['seeds'],
          'accuracy_per_l2': r['accuracy_per_l2'],
      }
  return out


class FewShotDataset(NamedTuple):
  """One transfer dataset: splits as one-pass batch sources (see `features.py`)."""
  name: str
  train_split: str
  test_split: str
  num_classes: int
  train: Any
  test: Any


class FewShotEvaluator:
  """Extracts features with the given params and runs the few-shot protocol.

  `evaluator(params)` returns `{'fewshot/<dataset>/<shot>shot': mean accuracy}`;
  `evaluator.run(params)` returns the full per-dataset, per-shot results. Both
  take the router state to route with as `model_state` (`nn.router_state`; None
  for a stateless router).
  """

  def __init__(self, model, datasets: Mapping[str, FewShotDataset], *,
               shots: Sequence[int], seeds: Sequence[int], l2_regs: Sequence[float],
               l2_selection: str = 'loo', holdout_fraction: float = 0.2, mesh=None):
    if l2_selection not in fewshot_config.L2_SELECTIONS:
      raise ValueError(f'l2_selection must be one of {fewshot_config.L2_SELECTIONS}; '
                       f'got {l2_selection!r}.')
    self.datasets = dict(datasets)
    self.protocol = dict(shots=tuple(int(s) for s in shots),
                         seeds=tuple(int(s) for s in seeds),
                         l2_regs=tuple(float(v) for v in l2_regs),
                         l2_selection=l2_selection, holdout_fraction=float(holdout_fraction))
    self._feature_fn = features_lib.make_feature_fn(model, mesh=mesh)

  def run(self, params, model_state=None) -> dict:
    """`{dataset: {'name', 'train_split', 'test_split', 'num_classes', 'num_train',
    'num_test', 'shots': evaluate_features(...)}}`."""
    out = {}
    for key, ds in self.datasets.items():
      train_x, train_y = features_lib.extract(self._feature_fn, params, ds.train, model_state)
      test_x, test_y = features_lib.extract(self._feature_fn, params, ds.test, model_state)
      try:
        shots = evaluate_features(train_x, train_y, test_x, test_y,
                                  num_classes=ds.num_classes, **self.protocol)
      except ValueError as e:
        raise ValueError(f'Few-shot dataset {key!r} ({ds.name}, split '
                         f'{ds.train_split!r}): {e}') from e
      out[key] = {'name': ds.name, 'train_split': ds.train_split,
                  'test_split': ds.test_split, 'num_classes': ds.num_classes,
                  'num_train': int(len(train_y)), 'num_test': int(len(test_y)),
                  'shots': shots}
    if self.protocol['l2_selection'] == 'reference' and out:
      # One L2 per shot for all datasets (each dataset alone chose its own above).
      chosen = _reference_results([ds['shots'] for ds in out.values()],
                                  self.protocol['l2_regs'])
      for ds, shots in zip(out.values(), chosen):
        ds['shots'] = shots
    return out

  def __call__(self, params, model_state=None) -> dict[str, float]:
    return metrics_from_results(self.run(params, model_state))


def metrics_from_results(results: Mapping[str, Mapping]) -> dict[str, float]:
  """Flattens `FewShotEvaluator.run` output to `{'fewshot/<dataset>/<shot>shot': mean}`."""
  return {metric_name(key, shot): r['accuracy_mean']
          for key, ds in results.items() for shot, r in ds['shots'].items()}


def make_evaluator(config: ml_collections.ConfigDict, model, *, mesh=None) -> FewShotEvaluator:
  """Builds the evaluator of `config.fewshot` for `model` (see module docstring).

  Reads `config.fewshot` (see `default_fewshot_config()`; validated first) and the
  input geometry `config.dataset.{image_size, channels, data_dir}`: every dataset
  is resized to the model's input, or preprocessed by `config.fewshot.pp`. Raises `DatasetError` naming the dataset that
  cannot be loaded.
  """
  fs = config.fewshot
  fewshot_config.validate(fs)
  if fs.batch_size % jax.process_count():
    raise ValueError(f'config.fewshot.batch_size={fs.batch_size} must be a multiple of the '
                     f'process count {jax.process_count()}.')
  per_process_batch = fs.batch_size // jax.process_count()
  data_dir = config.dataset.get('data_dir')
  datasets = {}
  for key, spec in fs.datasets.items():
    try:
      num_classes = data.num_classes(spec.name, data_dir=data_dir)
      splits = [
          data.make_dataset(spec.name, split, batch_size=per_process_batch,
                            image_size=config.dataset.image_size,
                            channels=config.dataset.channels, training=False,
                            data_dir=data_dir, pp=fs.pp)
          for split in (spec.train_split, spec.test_split)]
    except Exception as e:  # TFDS raises many types; all mean "cannot load it".
      raise DatasetError(
          f'Few-shot dataset {key!r} (name={spec.name!r}, splits {spec.train_split!r}/'
          f'{spec.test_split!r}) cannot be loaded: {type(e).__name__}: {e}') from e
    datasets[key] = FewShotDataset(spec.name, spec.train_split, spec.test_split,
                                   num_classes, *splits)
  return FewShotEvaluator(
      model, datasets, shots=fs.shots, seeds=fs.seeds, l2_regs=fs.l2_regs,
      l2_selection=fs.l2_selection, holdout_fraction=fs.holdout_fraction, mesh=mesh)


class PeriodicFewShot:
  """Runs the evaluator on the first call, every `every_steps` and on `last_step`.

  `action(step, params, model_state=None)` writes the metrics to the CLU `writer` (`write_scalars`)
  and returns them when it triggered, else returns None. "First" is the first call,
  so a run resumed from a checkpoint evaluates at its first step too.
  """

  def __init__(self, evaluator, writer, *, every_steps: int, last_step: int):
    if every_steps <= 0:
      raise ValueError(f'every_steps must be positive; got {every_steps}.')
    self.evaluator = evaluator
    self.writer = writer
    self.every_steps = int(every_steps)
    self.last_step = int(last_step)
    self._called = False

  def should_run(self, step: int) -> bool:
    return (not self._called) or step % self.every_steps == 0 or step == self.last_step

  def __call__(self, step: int, params, model_state=None) -> dict[str, float] | None:
    run = self.should_run(step)
    self._called = True
    if not run:
      return None
    metrics = self.evaluator(params, model_state)
    logging.info('Few-shot at step %d: %s', step, metrics)
    self.writer.write_scalars(step, metrics)
    return metrics


def periodic_fewshot(config, model, mesh, writer) -> PeriodicFewShot | None:
  """The trainer's few-shot hook (`train_and_evaluate(..., fewshot=periodic_fewshot)`).

  A PeriodicFewShot over `config.fewshot` every `config.fewshot.every_steps` steps
  and at the last step, writing to `writer`; None when every_steps is 0.
  """
  if config.fewshot.every_steps <= 0:
    return None
  evaluator = make_evaluator(config, model, mesh=mesh)
  return PeriodicFewShot(evaluator, writer, every_steps=config.fewshot.every_steps,
                         last_step=config.train_steps)
