"""experiments.common: the helpers the experiments share."""
import os

import numpy as np

from vmoe_sparse_ot.experiments import common


def test_max_col_nnz_counts_the_fullest_column():
  T = np.array([[1.0, 0.0], [2.0, 1e-9], [0.0, 3.0]])
  assert common.max_col_nnz(T) == 2
  assert common.max_col_nnz(T, rtol=1e-6) == 2
  assert common.max_col_nnz(np.eye(3)) == 1


def test_format_rows_aligns_columns_under_a_rule():
  text = common.format_rows([['name', 'n'], ['topk', 12], ['sparse_ot', 3]], title='T')
  assert text == ('T\n'
                  'name       n\n'
                  '---------  --\n'
                  'topk       12\n'
                  'sparse_ot  3')


def test_seeds_or_timed_and_quiet_stdout(capsys):
  assert common.seeds_or(None, 5) == 5 and common.seeds_or(2, 5) == 2
  out, seconds = common.timed(lambda x, y=1: x + y, 2, y=3)
  assert out == 5 and seconds >= 0
  with common.quiet_stdout():
    print('hidden')
  assert capsys.readouterr().out == ''


def test_pot_is_imported_without_tensorflow():
  module = common.pot()
  assert module.__name__ == 'ot' and hasattr(module, 'emd')
  assert os.environ['POT_BACKEND_DISABLE_TENSORFLOW'] == '1'
