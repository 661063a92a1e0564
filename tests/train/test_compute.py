"""Compute accounting: flops_per_step is XLA's count of the compiled step; device-seconds, MFU."""
import json
import os

import jax
import pytest

from vmoe_sparse_ot import nn
from vmoe_sparse_ot.train import compute
from vmoe_sparse_ot.train import run as run_lib
from vmoe_sparse_ot.train import trainer
from tests.train import helpers


def test_flops_per_step_is_the_cost_analysis_of_the_compiled_train_step(topk_six_steps):
  workdir, summary = topk_six_steps
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    rows = [r for r in map(json.loads, f) if r['split'] == 'train']
  # The same run's programs (kept in this process) and its first batch's shapes.
  config = helpers.small_config('router=topk', **helpers.SIX_STEPS)
  run = run_lib.build(config, nn.build_model(config.model), jax.devices()[:1])
  with jax.set_mesh(run.mesh):
    _, batch = trainer._train_batches(run, 0)  # pylint: disable=protected-access
    compiled = run.programs.train_step.lower(trainer.state_with_shardings(run), batch,
                                             run.programs.empty_metrics(batch)).compile()
  flops = compiled.cost_analysis()['flops']
  assert [r['flops_per_step'] for r in rows] == [flops] * len(rows)
  assert summary['flops_per_step'] == flops
  # At least the patch embedding's forward multiply-adds: B images of 16 patches of
  # 7x7 pixels into D (the backward pass and the rest come on top).
  assert flops > 2 * config.batch_size * 16 * 49 * config.model.hidden_size
  # CPU: device-seconds on the timed rows, no peak, so no mfu.
  timed = [r for r in rows if 'steps_per_sec' in r]
  assert timed and all(r['device_seconds_per_step'] == pytest.approx(1 / r['steps_per_sec'])
                       for r in timed)
  assert not any('mfu' in r for r in rows) and 'device_seconds_per_step' not in rows[0]


def test_mfu_and_device_seconds_by_hand():
  calls = []
  account = compute.StepAccounting(lambda: calls.append(1) or 4e12, num_devices=8,
                                   peak_flops_per_device=1e14)
  assert account.scalars(None) == {'flops_per_step': 4e12}
  # 0.1 s per step on 8 devices: 0.8 device-seconds; 4e12 / (0.1 * 1e14) = 0.4.
  assert account.scalars(0.1) == pytest.approx(
      {'flops_per_step': 4e12, 'device_seconds_per_step': 0.8, 'mfu': 0.4})
  assert calls == [1]   # Counted once.
  unknown = compute.StepAccounting(lambda: None, num_devices=1, peak_flops_per_device=None)
  assert unknown.scalars(0.5) == {'device_seconds_per_step': 0.5}


@pytest.mark.parametrize('kind, peak', [
    ('NVIDIA H100 80GB HBM3', 989e12), ('NVIDIA H100 PCIe', 756e12), ('NVIDIA H200', 989e12),
    ('NVIDIA A100-SXM4-40GB', 312e12), ('NVIDIA L4', 121e12), ('NVIDIA L40S', 362e12),
    ('TPU v3', 61.5e12), ('TPU v4', 275e12), ('TPU v5 lite', 197e12), ('TPU v5p', 459e12),
    ('TPU v6 lite', 918e12), ('cpu', None), ('Tesla V100-SXM2-16GB', None)])
def test_peak_flops_table(kind, peak):
  assert compute.table_peak_flops(kind) == peak


def test_a_configured_peak_wins_over_the_table():
  device = jax.devices()[0]          # CPU: not in the table
  assert compute.peak_flops_per_device(None, device) is None
  assert compute.peak_flops_per_device(2e12, device) == 2e12


def test_the_count_is_per_device():
  # A (64, 32) x (32, 16) product: 2 * 64 * 32 * 16 FLOPs in all; rows split over the
  # devices, each device multiplies its 64 / n rows.
  n = jax.device_count()
  mesh = jax.make_mesh((n,), ('data',))
  rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec('data'))
  a = jax.ShapeDtypeStruct((64, 32), 'float32', sharding=rows)
  b = jax.ShapeDtypeStruct((32, 16), 'float32')
  compiled = jax.jit(lambda a, b: a @ b).lower(a, b).compile()
  assert compute.compiled_flops(compiled) == 2 * 64 * 32 * 16 / n
