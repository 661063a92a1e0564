"""Device-side metric averaging, the JSON-lines writer and batch prefetching."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from vmoe_sparse_ot.train import metrics as metrics_lib
from vmoe_sparse_ot import parallel


def _run(steps, values, max_steps=4):
  """Merges `values[i]` as step `steps[i]` inside jit, as the train step does."""
  update = jax.jit(lambda m, v, s: m.update(v, s))
  m = metrics_lib.TrainMetrics.empty(['loss', 'grad_norm', 'accuracy'], max_steps)
  for step, v in zip(steps, values):
    m = update(m, {k: jnp.float32(x) for k, x in v.items()}, jnp.int32(step))
  return jax.device_get(m)


def test_train_metrics_average_the_interval_and_keep_each_loss():
  values = [dict(loss=2.0, grad_norm=1.0, accuracy=0.25),
            dict(loss=1.0, grad_norm=3.0, accuracy=0.5),
            dict(loss=0.5, grad_norm=2.0, accuracy=1.0)]
  m = _run([7, 8, 9], values)
  assert m.compute() == pytest.approx({'loss': 3.5 / 3, 'grad_norm': 2.0, 'accuracy': 1.75 / 3})
  assert m.step_losses() == [2.0, 1.0, 0.5]
  assert int(m.first_nonfinite_step) == 0


def test_train_metrics_remember_the_first_nonfinite_step():
  values = [dict(loss=1.0, grad_norm=1.0, accuracy=0.0),
            dict(loss=1.0, grad_norm=np.inf, accuracy=0.0),
            dict(loss=np.nan, grad_norm=1.0, accuracy=0.0)]
  m = _run([11, 12, 13], values)
  assert int(m.first_nonfinite_step) == 12


def test_split_scalars_and_jsonl_writer(tmp_path):
  path = str(tmp_path / 'metrics.jsonl')
  writer = metrics_lib.JsonlWriter(path)
  writer.write_scalars(5, {'loss': 1.5, 'routing/encoderblock_1/load_loss': np.float32(0.25)})
  writer.write_scalars(10, {'eval/loss': 2.0, 'eval/accuracy': 0.5,
                            'fewshot/digits/1shot': 0.75})
  writer.close()
  with open(path) as f:
    records = [json.loads(line) for line in f]
  assert records == [
      {'step': 5, 'split': 'train', 'loss': 1.5, 'routing/encoderblock_1/load_loss': 0.25},
      {'step': 10, 'split': 'eval', 'loss': 2.0, 'accuracy': 0.5},
      {'step': 10, 'split': 'fewshot', 'digits/1shot': 0.75},
  ]
  # A resumed run from step 5 drops what the interrupted run wrote after it,
  # including a line cut short by the kill.
  with open(path, 'a') as f:
    f.write('{"step": 12, "spl')
  metrics_lib.drop_records_after(path, 5)
  with open(path) as f:
    assert [json.loads(line) for line in f] == records[:1]


def test_prefetch_keeps_order_and_stays_two_batches_ahead():
  mesh = parallel.make_mesh({'data': -1, 'expert': 1}, jax.devices()[:2])
  sharding = parallel.batch_sharding(mesh)
  pulled = []

  def source():
    for i in range(5):
      pulled.append(i)
      yield {'x': np.full((4, 3), i, np.float32)}

  out = []
  for batch in parallel.prefetch_to_mesh(source(), sharding, size=2):
    # When batch i is handed out, batch i + 1 is already on its way to the mesh.
    assert pulled[-1] == min(len(out) + 1, 4)
    assert batch['x'].sharding == sharding and batch['x'].shape == (4, 3)
    out.append(float(batch['x'][0, 0]))
  assert out == [0.0, 1.0, 2.0, 3.0, 4.0]
