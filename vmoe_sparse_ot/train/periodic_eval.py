"""Evaluation during training: the run's eval split and `config.evaluate.datasets`.

The default set is `config.dataset.name` / `eval_split` preprocessed by
`pp_eval`, logged as before (`eval/loss`, `eval/accuracy`, `eval/num_examples`,
and `summary['eval']`). Each entry NAME of `config.evaluate.datasets`,

    config.evaluate.datasets = {
        'real': {'dataset': 'imagenet2012_real', 'split': 'validation',
                 'pp': "decode|resize_small(256)|central_crop(224)|value_range(-1, 1)|"
                       "onehot(1000, key='label', key_result='labels')|keep('image', 'labels')",
                 'label_key': 'real_label'},
    }

is evaluated at the same steps and logged as `eval/NAME/loss`, `eval/NAME/accuracy`,
`eval/NAME/num_examples` (and `summary['eval_datasets'][NAME]`). `dataset`
defaults to `config.dataset.name`, `pp` to `config.dataset.pp_eval`, `label_key`
(the dataset's feature read as the example's 'label' before preprocessing) to
'label'; `split` is required. Loss and accuracy are the training loss's
(`train.losses`), without label smoothing.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, NamedTuple

import flax.linen
import jax
import jax.numpy as jnp
import ml_collections
from absl import logging

from vmoe_sparse_ot import data as data_lib
from vmoe_sparse_ot import nn
from vmoe_sparse_ot.config.schema import EVAL_DATASET_KEYS
from vmoe_sparse_ot.nn import overrides as model_overrides_lib
from vmoe_sparse_ot.nn import routing_stats
from vmoe_sparse_ot.train import losses as losses_lib

DEFAULT_NAME = ''  # The run's own eval split: metrics 'eval/<metric>'.


class EvalSet(NamedTuple):
  """One evaluation dataset, its defaults resolved."""
  name: str          # '' for the default set, else the config.evaluate.datasets key.
  dataset: str       # TFDS or embedded dataset name.
  split: str
  pp: str | None     # None: the `augment` mode's pp string.
  label_key: str     # Feature read as the example's 'label'.

  @property
  def title(self) -> str:
    """How the console names it: the split for the default, else NAME (dataset split)."""
    return self.split if not self.name else f'{self.name} ({self.dataset} {self.split})'


def eval_sets(config: Mapping[str, Any]) -> list[EvalSet]:
  """The default set, then `config.evaluate.datasets` in their order."""
  ds = config['dataset']
  out = [EvalSet(DEFAULT_NAME, ds['name'], ds['eval_split'], ds['pp_eval'], 'label')]
  for name, entry in config['evaluate']['datasets'].items():
    entry = {**EVAL_DATASET_KEYS, **dict(entry)}
    out.append(EvalSet(name, entry['dataset'] or ds['name'], entry['split'],
                       entry['pp'] if entry['pp'] is not None else ds['pp_eval'],
                       entry['label_key']))
  return out


def eval_model(config: ml_collections.ConfigDict, model: flax.linen.Module):
  """The model of the evaluations during training: `model`, or the one of
  `config.evaluate.model_overrides` over config.model (the same parameters)."""
  overrides = config.evaluate.get('model_overrides') or {}
  if not overrides:
    return model
  overrides = overrides.to_dict() if hasattr(overrides, 'to_dict') else dict(overrides)
  model_config = model_overrides_lib.apply_overrides(config.model, overrides,
                                                     'config.evaluate.model_overrides')
  return nn.build_model(model_config)


def log_eval_overrides(config: ml_collections.ConfigDict) -> None:
  """Logs the overrides of `eval_model`'s model, if any, in one line."""
  overrides = config.evaluate.get('model_overrides') or {}
  if overrides:
    overrides = overrides.to_dict() if hasattr(overrides, 'to_dict') else dict(overrides)
    changed = ', '.join(f'{k}={v!r}' for k, v in model_overrides_lib.leaves(overrides).items())
    logging.info('Evaluating with config.evaluate.model_overrides: %s', changed)


def metric_key(name: str, metric: str) -> str:
  return f'eval/{metric}' if name == DEFAULT_NAME else f'eval/{name}/{metric}'


def make_eval_step(model, loss: str = 'softmax_xent', *, num_tokens: int | None = None):
  """(params, batch, model_state) -> sums over the batch's real examples (mask True).

  Returns {'loss_sum', 'correct', 'count'} and, with `num_tokens` (N tokens per
  image), 'routing': {layer: `nn.routing_stats.routing_sums`} of every MoE layer.
  The one eval step of the trainer and of the evaluation job. `loss` is the
  training loss's name (`train.losses`, without label smoothing); a loss that
  reads float targets ('labels', e.g. `sigmoid_xent`) on a batch with only integer
  labels gets their one-hot over the model's classes, as V-MoE evaluates its
  sigmoid-trained models on single-label sets. `model_state`: the router state to
  route with (`nn.router_state`; {} for a stateless router), read, never updated.
  """
  loss_fn = losses_lib.get(loss)
  members = getattr(model, 'ensemble_size', 1)
  if members > 1:
    return _make_ensemble_eval_step(model, loss, members, num_tokens)

  def eval_step(params, batch, model_state=None):
    variables = {'params': params, **(model_state or {})}
    if num_tokens is None:
      (logits, _), state = model.apply(variables, batch['image'], train=False), None
    else:
      (logits, _), state = model.apply(variables, batch['image'], train=False,
                                       mutable=['intermediates'])
    if loss in losses_lib.NEEDS_LABELS and 'labels' not in batch:
      batch = {**batch, 'labels': jax.nn.one_hot(batch['label'], logits.shape[-1])}
    mask = batch['mask']
    per_example = loss_fn(logits, batch, 0.0)
    out = {'loss_sum': jnp.sum(jnp.where(mask, per_example, 0.0)),
           'correct': jnp.sum((losses_lib.top1_correct(logits, batch) > 0) & mask,
                              dtype=jnp.int32),
           'count': jnp.sum(mask, dtype=jnp.int32)}
    if num_tokens is not None:
      b = batch['image'].shape[0]
      out['routing'] = {layer: routing_stats.routing_sums(
          routing_stats.per_image(w, b, num_tokens), mask)
                        for layer, w in routing_stats.layer_weights(state).items()}
    return out

  return eval_step


def _make_ensemble_eval_step(model, loss: str, members: int, num_tokens: int | None):
  """`make_eval_step` of an E³ model (M = `members`): loss and top-1 of the members'
  mean probability (`train.losses`), and under 'ensemble' the sums that
  `ensemble_metrics` turns into the ECE and each member's loss, accuracy and ECE,
  and (with `num_tokens`) each member's routing sums ({layer: (sums of member 0,
  ...)})."""
  loss_fn = losses_lib.get(loss)
  ensemble_loss = losses_lib.ENSEMBLE_EVAL_LOSSES[loss]

  def eval_step(params, batch, model_state=None):
    variables = {'params': params, **(model_state or {})}
    (logits, _), state = model.apply(variables, batch['image'], train=False,
                                     mutable=['intermediates'])
    if loss in losses_lib.NEEDS_LABELS and 'labels' not in batch:
      batch = {**batch, 'labels': jax.nn.one_hot(batch['label'], logits.shape[-1])}
    mask = batch['mask']
    b = mask.shape[0]
    log_p = losses_lib.ensemble_log_probs(logits, members, loss)

    def sums(per_example, log_probs):
      return (jnp.sum(jnp.where(mask, per_example, 0.0)),
              jnp.sum((losses_lib.top1_correct(log_probs, batch) > 0) & mask, dtype=jnp.int32),
              losses_lib.calibration_bins(log_probs, batch, mask))

    loss_sum, correct, bins = sums(ensemble_loss(logits, batch, members), log_p)
    per_member = logits.reshape(b, members, -1)
    member_sums = [sums(loss_fn(z, batch, 0.0), losses_lib.ensemble_log_probs(z, 1, loss))
                   for z in (per_member[:, i] for i in range(members))]
    out = {'loss_sum': loss_sum, 'correct': correct, 'count': jnp.sum(mask, dtype=jnp.int32),
           'ensemble': {'calibration': bins,
                        'member_loss_sum': jnp.stack([m[0] for m in member_sums]),
                        'member_correct': jnp.stack([m[1] for m in member_sums]),
                        'member_calibration': jnp.stack([m[2] for m in member_sums])}}
    if num_tokens is not None:
      out['routing'], out['ensemble']['routing'] = {}, {}
      for layer, w in routing_stats.layer_weights(state).items():
        w = routing_stats.per_image(w, b * members, num_tokens)     # (B*M, N, E)
        out['routing'][layer] = routing_stats.routing_sums(
            w, jnp.repeat(mask, members, axis=0))
        w = w.reshape(b, members, *w.shape[1:])
        out['ensemble']['routing'][layer] = tuple(
            routing_stats.routing_sums(w[:, i], mask) for i in range(members))
    return out

  return eval_step


def ensemble_metrics(sums: Mapping[str, Any], count: int) -> dict[str, Any]:
  """From an E³ eval step's 'ensemble' sums over a set (host values): 'ece' (of the
  ensemble) and 'member{m}/loss', 'member{m}/accuracy', 'member{m}/ece'."""
  count = max(int(count), 1)
  out = {'ece': losses_lib.expected_calibration_error(sums['calibration'])}
  for i, (loss_sum, correct, bins) in enumerate(zip(
      sums['member_loss_sum'], sums['member_correct'], sums['member_calibration'])):
    out[f'member{i}/loss'] = float(loss_sum) / count
    out[f'member{i}/accuracy'] = int(correct) / count
    out[f'member{i}/ece'] = losses_lib.expected_calibration_error(bins)
  return out


def make_datasets(config, sets: Iterable[EvalSet], batch_size: int) -> list[tuple[EvalSet, Any]]:
  """(set, its single-pass padded tf.data stream for this process), in order."""
  ds = config['dataset']
  return [(s, data_lib.make_dataset(
      s.dataset, s.split, batch_size=batch_size, image_size=ds['image_size'],
      channels=ds['channels'], training=False, data_dir=ds['data_dir'],
      process_index=jax.process_index(), process_count=jax.process_count(),
      augment=ds['augment'] if s.pp is None else None, pp=s.pp, label_key=s.label_key))
          for s in sets]


def evaluate_all(run_one: Callable[[Any, Any], dict[str, float]], params,
                 datasets: list[tuple[EvalSet, Any]]) -> dict[str, dict[str, float]]:
  """{set name: run_one(params, dataset)} over every set, in order."""
  return {s.name: run_one(params, dataset) for s, dataset in datasets}


def log_results(step: int, results: Mapping[str, Mapping[str, float]], sets: Iterable[EvalSet],
                writer, seconds: float | None = None) -> None:
  """All sets' scalars in one write; one console line per set, the time on the first."""
  writer.write_scalars(step, {metric_key(name, k): v for name, result in results.items()
                              for k, v in result.items()})
  writer.flush()
  for i, s in enumerate(s for s in sets if s.name in results):
    r = results[s.name]
    took = '' if seconds is None or i else f', {seconds:.1f}s'
    logging.info('eval at step %d on %s: loss %.4f, top-1 accuracy %.4f (%d examples%s)', step,
                 s.title, r['loss'], r['accuracy'], r['num_examples'], took)

