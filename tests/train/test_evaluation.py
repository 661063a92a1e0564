"""train.evaluation: one pass folded over hand-made batches, and the metrics of sums
written out by hand."""
import operator

import numpy as np
import pytest

from vmoe_sparse_ot.train import evaluation

BATCHES = [{'x': np.array([1.0, 2.0])}, {'x': np.array([3.0])}, {'x': np.array([4.0, 5.0])}]


def test_fold_combines_every_batch_in_order_and_is_none_when_empty():
  assert evaluation.fold(lambda b: float(b['x'].sum()), BATCHES, operator.add) == 15.0
  # In order: combine(combine(f1, f2), f3).
  assert evaluation.fold(lambda b: [len(b['x'])], BATCHES, operator.add) == [2, 1, 2]
  assert evaluation.fold(lambda b: 1, [], operator.add) is None


def test_totals_sums_each_key_of_the_eval_step_over_the_batches():
  def eval_step(params, batch, model_state):
    assert model_state == {}                    # no router state: {}
    return {'loss_sum': params * batch['x'].sum(), 'count': np.int32(len(batch['x']))}

  sums = evaluation.totals(eval_step, 2.0, BATCHES, sharding=None)
  assert (float(sums['loss_sum']), int(sums['count'])) == (30.0, 5)
  assert evaluation.totals(eval_step, 2.0, [], sharding=None) is None


def test_metrics_of_hand_made_sums():
  sums = {'loss_sum': np.float32(6.0), 'correct': np.int32(3), 'count': np.int32(4),
          'routing': {'encoderblock_1': {'tokens': np.int32(40), 'dropped': np.int32(4)},
                      'encoderblock_3': {'tokens': np.int32(40), 'dropped': np.int32(6)}}}
  assert evaluation.metrics(sums) == {'loss': 1.5, 'accuracy': 0.75, 'num_examples': 4,
                                      'dropped_fraction': 10 / 80}
  # Without routing (a dense model), no dropped_fraction.
  assert evaluation.metrics({'loss_sum': 1.0, 'correct': 1, 'count': 2}) == {
      'loss': 0.5, 'accuracy': 0.5, 'num_examples': 2}
  assert 'routing' in sums                      # the caller's dict is left as it was


@pytest.mark.parametrize('sums', [None, {}])
def test_metrics_of_an_empty_dataset_are_zero_of_zero(sums):
  assert evaluation.metrics(sums) == {'loss': 0.0, 'accuracy': 0.0, 'num_examples': 0}
