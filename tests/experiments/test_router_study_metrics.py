"""The router study's balance columns: read from metrics.jsonl, summarized by hand."""
import json

import pytest

from vmoe_sparse_ot.experiments import router_study


def test_routing_summary_is_the_last_train_interval_averaged_over_layers(tmp_path):
  records = [
      {'step': 10, 'split': 'train', 'routing/encoderblock_1/max_load_violation': 9.0},
      {'step': 20, 'split': 'train', 'loss': 1.0,
       'routing/encoderblock_1/max_load_violation': 0.5,
       'routing/encoderblock_3/max_load_violation': 0.25,
       'routing/encoderblock_1/dropped_fraction': 0.1,
       'routing/encoderblock_3/dropped_fraction': 0.3,
       'routing/encoderblock_1/experts_per_token': 1.5,
       'routing/encoderblock_3/experts_per_token': 1.7,
       'routing/encoderblock_1/selected_max_load_violation': 7.0},
      {'step': 20, 'split': 'eval', 'accuracy': 0.5},
  ]
  (tmp_path / 'metrics.jsonl').write_text(''.join(json.dumps(r) + '\n' for r in records))
  got = router_study.routing_summary(str(tmp_path))
  assert got == pytest.approx({'max_load_violation': 0.375, 'dropped_fraction': 0.2,
                               'experts_per_token': 1.6})


def test_dense_run_has_no_routing_columns(tmp_path):
  (tmp_path / 'metrics.jsonl').write_text(json.dumps({'step': 1, 'split': 'train',
                                                      'loss': 2.0}) + '\n')
  assert router_study.routing_summary(str(tmp_path)) == {}


def test_summary_and_table_carry_the_balance_columns():
  runs = [{'router': r, 'seed': s, 'top1': 90.0, 'fewshot10': 60.0, 'train_wall_s': 10.0,
           'max_load_violation': v, 'dropped_fraction': d, 'experts_per_token': 1.5,
           'gflops': g}
          for r, s, v, d, g in [('topk', 0, 1.0, 0.2, 0.25), ('topk', 1, 2.0, 0.4, 0.25),
                                ('soft_moe', 0, 0.0, 0.0, 0.5), ('soft_moe', 1, 0.0, 0.0, None)]]
  s = router_study.summarize(runs, ['topk', 'soft_moe'])
  assert s['topk']['max_load_violation_mean'] == pytest.approx(1.5)
  assert s['topk']['max_load_violation_std'] == pytest.approx(2 ** -0.5)
  assert s['topk']['dropped_fraction_mean'] == pytest.approx(0.3)
  assert (s['topk']['gflops_mean'], s['soft_moe']['gflops_mean']) == (0.25, 0.5)
  payload = {'budgets': {'100': {'routers': s}}, 'paper': router_study.PAPER}
  table = router_study.format_table(payload)
  header, topk_row = table.splitlines()[:2]
  assert 'MaxVio' in header and 'dropped' in header and 'GFLOPs/step' in header
  assert '1.500 ± 0.707' in topk_row and '0.300 ± 0.141' in topk_row and ' 0.250 ' in topk_row
