"""train.progress: the console's durations, when a line is written, what it writes
and the non-finite check, on hand-made (already fetched) metrics."""
import logging
import re

import numpy as np
import pytest
from clu import metrics as clu_metrics

from vmoe_sparse_ot.errors import NonFiniteLossError
from vmoe_sparse_ot.train import compute
from vmoe_sparse_ot.train import progress as progress_lib
from vmoe_sparse_ot.train.metrics import TrainMetrics


def _fetched(losses, accuracy=0.5, grad_norm=1.0, first_nonfinite_step=0):
  """TrainMetrics as the host reads them: `losses` of the interval's steps, the other
  scalars' means as given."""
  n = len(losses)

  def average(total):
    return clu_metrics.Average(total=np.float32(total), count=np.int32(n))

  return TrainMetrics(
      averages={'loss': average(sum(losses)), 'accuracy': average(n * accuracy),
                'grad_norm': average(n * grad_norm)},
      first_nonfinite_step=np.int32(first_nonfinite_step),
      losses=np.array(list(losses) + [np.nan] * (5 - n), np.float32))


class Writer:

  def __init__(self):
    self.written = []

  def write_scalars(self, step, scalars):
    self.written.append((step, dict(scalars)))


def _logger(writer=None, steps=range(11, 21), every_steps=5):
  return progress_lib.ProgressLogger(
      steps=steps, every_steps=every_steps,
      accounting=compute.StepAccounting(lambda: None, 1, None, images_per_step=4),
      learning_rate=lambda s: 0.01 * s, writer=writer,
      last_good=lambda bad: f'The last good checkpoint is step {bad - 2} in DIR.')


@pytest.mark.parametrize('seconds, text', [
    (0, '0m00s'), (59.4, '0m59s'), (59.6, '1m00s'), (754, '12m34s'),
    (3599, '59m59s'), (3600, '1h00m00s'), (3725, '1h02m05s'), (90061, '25h01m01s')])
def test_format_duration(seconds, text):
  assert progress_lib.format_duration(seconds) == text


def test_lines_on_the_first_step_every_n_and_the_last():
  logger = _logger()
  assert [s for s in range(11, 21) if logger.should_log(s)] == [11, 15, 20]


def test_the_first_nonfinite_step_of_the_interval_is_named_with_the_last_good_checkpoint():
  logger = _logger()
  bad = _fetched([1.0, np.inf, np.nan], first_nonfinite_step=12)
  with pytest.raises(NonFiniteLossError, match=r'^Non-finite training loss or gradient at '
                     r'step 12; stopping\. The last good checkpoint is step 10 in DIR\.$'):
    logger.check_finite(13, bad, bad.compute())
  # Without a recorded step, a non-finite mean names the logging step.
  for means in ({'loss': np.nan, 'grad_norm': 1.0}, {'loss': 1.0, 'grad_norm': np.inf}):
    with pytest.raises(NonFiniteLossError, match=r'at step 15; .* step 13 in DIR\.$'):
      logger.check_finite(15, _fetched([1.0]), means)
  logger.check_finite(15, _fetched([1.0]), {'loss': 1.0, 'grad_norm': 2.0})


def test_log_writes_the_interval_means_and_one_line(caplog):
  writer = Writer()
  logger = _logger(writer)
  with caplog.at_level(logging.INFO):
    logger.log(11, _fetched([2.0], accuracy=0.25))
    logger.log(15, _fetched([1.0, 2.0, 3.0, 6.0], accuracy=0.75, grad_norm=0.5))
  (step_a, first), (step_b, second) = writer.written
  # optax counts steps from 0: step 11 ran at learning_rate(10).
  assert (step_a, first) == (11, {'loss': 2.0, 'accuracy': 0.25, 'grad_norm': 1.0,
                                  'learning_rate': pytest.approx(0.1)})
  assert step_b == 15 and sorted(second) == ['accuracy', 'device_seconds_per_step',
                                             'grad_norm', 'images_per_sec',
                                             'learning_rate', 'loss', 'steps_per_sec']
  assert (second['loss'], second['accuracy'], second['grad_norm']) == (3.0, 0.75, 0.5)
  assert second['images_per_sec'] == pytest.approx(4 * second['steps_per_sec'])
  assert second['device_seconds_per_step'] == pytest.approx(1 / second['steps_per_sec'])
  lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith('step ')]
  assert re.fullmatch(r'step 11/20: compiled and ran in \d+\.\ds; loss 2\.0000, '
                      r'accuracy 0\.250; lr 1\.00e-01', lines[0]), lines[0]
  assert re.fullmatch(r'step 15/20: mean of steps 12-15: loss 3\.0000, accuracy 0\.750; '
                      r'lr 1\.40e-01; [\d.]+ steps/s, \d+ images/s; ETA \d+m\d\ds', lines[1]), \
      lines[1]
  summary = logger.summary()
  assert summary['train_loss_last_interval_mean'] == summary['final_train_loss'] == 3.0
  assert summary['train_last_interval_steps'] == [12, 15]
  assert summary['train_loss_history'] == [(11, 2.0), (15, 3.0)]
  assert summary['losses'] == [2.0, 1.0, 2.0, 3.0, 6.0]
  assert summary['steps_per_sec'] == pytest.approx(second['steps_per_sec'])


def test_steps_per_sec_leave_out_the_first_step_and_paused_time(monkeypatch, caplog):
  now = [100.0]
  monkeypatch.setattr(progress_lib.time, 'monotonic', lambda: now[0])
  writer = Writer()
  logger = _logger(writer)
  now[0] = 105.0
  logger.log(11, _fetched([2.0]))           # compiled and ran in 5.0s
  now[0] = 106.0
  with logger.paused():                     # e.g. an evaluation: 7 s
    now[0] = 113.0
  now[0] = 114.0                            # 9 s after step 11, 2 of them training
  with caplog.at_level(logging.INFO):
    logger.log(15, _fetched([1.0] * 4))
  assert writer.written[1][1]['steps_per_sec'] == 2.0   # steps 12-15 in 2 s
  assert writer.written[1][1]['images_per_sec'] == 8.0
  assert caplog.records[-1].getMessage().endswith('2.00 steps/s, 8 images/s; ETA 0m02s')
  assert logger.summary()['steps_per_sec'] == 2.0
