"""quickstart: train, few-shot and plots in one process (its whole run: tests/test_docs.py,
through scripts/main.sh)."""
from tests.test_cli import _one_line_error, _run
from tests.train.helpers import TINY


def test_quickstart_refuses_a_mistake_before_anything_trains(tmp_path):
  """`python -m vmoe_sparse_ot.quickstart` (scripts/main.sh) checks its few-shot step's
  datasets before training: a dataset that does not exist is its one line, before a
  workdir exists (its flags parse as the trainer's: cli.parse_flags, tests/test_cli.py)."""
  proc = _run('vmoe_sparse_ot.quickstart', f'--config={TINY}', f'--workdir={tmp_path}/w',
              '--config.fewshot.datasets.mnist.name=nope')
  line = _one_line_error(proc, 'python -m vmoe_sparse_ot.quickstart')
  assert "config.fewshot.datasets.mnist: dataset 'nope' is neither embedded" in line
  assert not (tmp_path / 'w').exists()
