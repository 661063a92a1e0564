"""The one evaluation loop: a function over every batch of one pass, folded.

The trainer's evaluations, the evaluation job and few-shot feature extraction
all read a dataset through `fold`: sums of an eval step (`totals`, turned into
metrics by `metrics`) or per-batch features gathered on the host.
"""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, TypeVar

import jax
import jax.numpy as jnp

from vmoe_sparse_ot import parallel
from vmoe_sparse_ot.train import periodic_eval

T = TypeVar('T')


def batches(dataset: Any, sharding: Any = None) -> Iterator[Any]:
  """One pass over `dataset` (a `tf.data.Dataset` or any iterable of dicts of arrays),
  put on the mesh two batches ahead when `sharding` (a batch sharding) is given."""
  examples: Iterable[Any] = (dataset.as_numpy_iterator() if hasattr(dataset, 'as_numpy_iterator')
                             else iter(dataset))
  return parallel.prefetch_to_mesh(examples, sharding) if sharding is not None else iter(examples)


def fold(fn: Callable[[Any], T], dataset: Any, combine: Callable[[T, T], T], *,
         sharding: Any = None) -> T | None:
  """combine(...combine(fn(batch_1), fn(batch_2))..., fn(batch_n)) over one pass of
  `dataset` (see `batches`); None when it yields no batch."""
  out = None
  for batch in batches(dataset, sharding):
    value = fn(batch)
    out = value if out is None else combine(out, value)
  return out


def totals(eval_step: Callable[..., Any], params: Any, dataset: Any, sharding: Any,
           model_state: Any = None) -> dict[str, Any] | None:
  """The sums of `eval_step(params, batch, model_state)` over `dataset` (host values),
  summed on the device and fetched once; None for a dataset with no batch.

  eval_step: `periodic_eval.make_eval_step`'s, jitted. model_state: the router
  state to route with ({} or None: none).
  """
  out = fold(lambda batch: eval_step(params, batch, model_state or {}), dataset,
             lambda a, b: jax.tree.map(jnp.add, a, b), sharding=sharding)
  return None if out is None else jax.device_get(out)


def metrics(sums: dict[str, Any] | None) -> dict[str, Any]:
  """Loss and top-1 accuracy of `totals`' sums over every real (mask=True) example,
  their number, for an E³ model its ensemble's metrics (`periodic_eval.ensemble_metrics`),
  and for an eval step that reports routing (a V-MoE) `dropped_fraction`: the real
  tokens no expert processed, over all MoE layers. No sums (an empty dataset):
  loss and accuracy 0 of 0 examples."""
  sums = dict(sums or {})
  routing = sums.pop('routing', None)
  ensemble = sums.pop('ensemble', None)
  sums = {k: float(v) for k, v in sums.items()}
  count = max(sums.get('count', 0.0), 1.0)
  result = {'loss': sums.get('loss_sum', 0.0) / count,
            'accuracy': sums.get('correct', 0.0) / count,
            'num_examples': int(sums.get('count', 0.0))}
  if ensemble is not None:
    result.update(periodic_eval.ensemble_metrics(ensemble, count))
  if routing:
    tokens = sum(int(r['tokens']) for r in routing.values())
    result['dropped_fraction'] = sum(int(r['dropped']) for r in routing.values()) / max(
        tokens, 1)
  return result
