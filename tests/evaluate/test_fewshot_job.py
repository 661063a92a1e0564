"""The standalone job `python -m vmoe_sparse_ot.fewshot` on a tiny checkpoint."""
import json
import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from vmoe_sparse_ot import fewshot as job
from vmoe_sparse_ot import nn
from vmoe_sparse_ot.evaluate import fewshot
from vmoe_sparse_ot.train import checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A tiny V-MoE on 8x8 digits; `get_config('bad')` names a dataset that does not exist.
CONFIG_FILE = textwrap.dedent('''
    import ml_collections
    from vmoe_sparse_ot.evaluate import fewshot
    from vmoe_sparse_ot.nn import config as nn_config

    def get_config(arg=None):
      config = ml_collections.ConfigDict()
      config.model = nn_config.default_model_config()
      config.model.hidden_size = 16
      config.model.encoder.num_layers = 1
      config.model.encoder.num_heads = 2
      config.model.encoder.mlp_dim = 32
      config.model.encoder.moe.layers = '0'
      config.model.encoder.moe.num_experts = 4
      config.model.encoder.moe.group_size = 4
      config.dataset = ml_collections.ConfigDict(dict(
          name='sklearn_digits', image_size=8, channels=1, data_dir=DATA_DIR))
      config.fewshot = fewshot.default_fewshot_config()
      config.fewshot.shots = (1, 5)
      config.fewshot.seeds = (0, 1)
      config.fewshot.batch_size = 128
      config.fewshot.datasets = fewshot.transfer_datasets('digits')
      if arg == 'bad':
        config.fewshot.datasets.nope = dict(
            name='no_such_dataset', train_split='train', test_split='test')
      return config
''')


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
  """(config path, workdir with checkpoints at steps 3 and 5)."""
  tmp = tmp_path_factory.mktemp('fewshot_job')
  config_path = tmp / 'tiny_digits.py'
  config_path.write_text(f'DATA_DIR = {str(tmp / "data")!r}\n' + CONFIG_FILE)
  namespace = {}
  exec(compile(config_path.read_text(), str(config_path), 'exec'), namespace)
  config = namespace['get_config']()
  model = nn.build_model(config.model)
  init = jax.jit(lambda key, x: model.init({'params': key}, x, train=False))
  workdir = tmp / 'workdir'
  saver = checkpoints.Checkpointer(str(workdir), async_save=False)
  for step in (3, 5):
    params = init(jax.random.key(step), np.zeros((2, 8, 8, 1), np.float32))['params']
    saver.save(step, params, {'count': np.int32(step)},
               {'step': step, 'model_config': config.model.to_dict(),
                'param_shapes': checkpoints.param_shapes(params)})
  saver.close()
  return config_path, workdir, namespace['get_config']


def _run_job(*args):
  return subprocess.run([sys.executable, '-m', 'vmoe_sparse_ot.fewshot', *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_job_evaluates_latest_checkpoint_prints_table_and_writes_json(setup):
  config_path, workdir, _ = setup
  proc = _run_job(f'--config={config_path}', f'--workdir={workdir}')
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'at step 5' in proc.stdout
  assert any(line.split()[:2] == ['digits', '5'] for line in proc.stdout.splitlines())
  with open(workdir / 'fewshot' / 'results.json') as f:
    results = json.load(f)
  assert results['step'] == 5
  assert sorted(results['metrics']) == ['fewshot/digits/1shot', 'fewshot/digits/5shot']
  digits = results['datasets']['digits']
  assert (digits['num_train'], digits['num_test'], digits['num_classes']) == (1437, 360, 10)
  for shot in ('1', '5'):
    r = digits['shots'][shot]
    assert len(r['accuracy']) == len(r['l2_reg']) == 2
    assert r['accuracy_mean'] > 0.2  # chance is 0.1; random ViT features still transfer
  assert not [p for p in os.listdir(workdir / 'fewshot') if p != 'results.json']


def test_run_evaluates_the_requested_step(setup):
  config_path, workdir, get_config = setup
  payload = job.run(get_config(), str(workdir), step=3)
  assert payload['step'] == 3
  with open(workdir / 'fewshot' / 'results.json') as f:
    assert json.load(f)['step'] == 3
  table = job.format_table(payload)
  assert 'at step 3' in table and 'digits' in table


def test_missing_checkpoint_fails_clearly(setup, tmp_path):
  config_path, _, get_config = setup
  proc = _run_job(f'--config={config_path}', f'--workdir={tmp_path}')
  assert proc.returncode == 1
  assert str(tmp_path / 'checkpoints') in proc.stderr
  assert not (tmp_path / 'fewshot').exists()
  with pytest.raises(FileNotFoundError, match='step 4'):
    job.run(get_config(), str(setup[1]), step=4)


def test_unknown_dataset_fails_clearly(setup):
  _, workdir, get_config = setup
  with pytest.raises(fewshot.DatasetError, match="'nope' .name='no_such_dataset'"):
    job.run(get_config('bad'), str(workdir))


def test_checkpoint_of_another_model_fails_clearly(setup):
  _, workdir, get_config = setup
  config = get_config()
  config.model.hidden_size = 24
  with pytest.raises(job.CheckpointMismatchError, match='checkpoint .16.*, model .24'):
    job.run(config, str(workdir))
