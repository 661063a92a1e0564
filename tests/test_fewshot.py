"""The standalone job `python -m vmoe_sparse_ot.fewshot` on a tiny checkpoint."""
import json
import os
import shutil
import subprocess
import sys
import textwrap

import jax
import pytest

from vmoe_sparse_ot import fewshot as job
from vmoe_sparse_ot.evaluate import transfer
from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot.config import cli
from vmoe_sparse_ot.train import trainer
from tests.xla_flags import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A tiny V-MoE trained for 5 steps on 8x8 digits, with periodic few-shot every 2
# steps; `get_config('bad')` adds a few-shot dataset that does not exist and
# `get_config('sparse_ot')` names another router than the one trained (topk).
CONFIG_FILE = textwrap.dedent('''
    from vmoe_sparse_ot.evaluate import transfer
    from vmoe_sparse_ot import config as config_lib

    def get_config(arg=None):
      config = config_lib.base_config()
      config.model.hidden_size = 16
      config.model.encoder.num_layers = 1
      config.model.encoder.num_heads = 2
      config.model.encoder.mlp_dim = 32
      config.model.encoder.moe.layers = '0'
      config.model.encoder.moe.num_experts = 4
      config.model.encoder.moe.group_size = 4
      config.dataset.update(dict(name='sklearn_digits', train_split='train',
                                 eval_split='test', image_size=8, channels=1,
                                 data_dir=DATA_DIR, shuffle_buffer=256, augment='none'))
      config.batch_size = 16
      config.eval_batch_size = 64
      config.train_steps = 5
      config.schedule.warmup_steps = 1
      config.checkpoint.every_steps = 3
      config.checkpoint.async_save = False
      config.log_every_steps = 5
      config.eval_every_steps = 0
      config.fewshot.every_steps = 2
      config.fewshot.shots = (1, 5)
      config.fewshot.seeds = (0, 1)
      config.fewshot.batch_size = 128
      config.fewshot.datasets = transfer.transfer_datasets('digits')
      if arg == 'sparse_ot':  # Another router than the checkpoint's (topk).
        config.model.encoder.moe.router.name = 'sparse_ot'
      if arg == 'bad':
        config.fewshot.datasets.nope = dict(
            name='no_such_dataset', train_split='train', test_split='test')
      config.lock()
      return config
''')


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
  """(config path, workdir of a 5-step training run)."""
  tmp = tmp_path_factory.mktemp('fewshot_job')
  config_path = tmp / 'tiny_digits.py'
  # The default data_dir, where the other tests prepare sklearn_digits too (once a
  # machine; a fresh one per run took seconds of TFRecord writing).
  config_path.write_text('DATA_DIR = None\n' + CONFIG_FILE)
  workdir = tmp / 'workdir'
  # One device: compiling for the 8 fake CPU devices costs time and tests nothing here.
  trainer.train_and_evaluate(config_lib.load_config_file(str(config_path)), str(workdir),
                             devices=jax.devices()[:1], fewshot=transfer.periodic_fewshot)
  return config_path, workdir


def test_training_run_wrote_periodic_fewshot_metrics(setup):
  from tensorboard.backend.event_processing import event_accumulator
  _, workdir = setup
  acc = event_accumulator.EventAccumulator(str(workdir), size_guidance={'tensors': 0})
  acc.Reload()
  for tag in ('fewshot/digits/1shot', 'fewshot/digits/5shot'):
    events = acc.Tensors(tag) if tag in acc.Tags()['tensors'] else acc.Scalars(tag)
    assert [e.step for e in events] == [1, 2, 4, 5]  # first, every 2, last


def _run_job(*args):
  env = dict(os.environ, XLA_FLAGS=xla_flags(1))
  return subprocess.run([sys.executable, '-m', 'vmoe_sparse_ot.fewshot', *args],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def job_in_process(monkeypatch, capfd):
  """`job_in_process(*args)`: what `python -m vmoe_sparse_ot.fewshot ARGS` runs after absl's
  set-up (cli.parse_flags, then main), in this process; (status, stdout, stderr).

  No interpreter, JAX and TensorFlow start per call (the job's console as a process:
  test_job_evaluates_latest_checkpoint_prints_table_and_writes_json). absl's global flags are left unparsed afterwards, without
  the --config.* override flags config_flags defined.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top

  def reset():
    for name in [n for n in flags.FLAGS if n.startswith('config.')]:
      delattr(flags.FLAGS, name)
    flags.FLAGS.unparse_flags()

  def run(*args):
    argv = [job.__file__, *args]
    monkeypatch.setattr(sys, 'argv', argv)  # config_flags reads its overrides there.
    reset()
    capfd.readouterr()
    try:
      job.main(cli.parse_flags(job.PROG, argv))
      status = 0
    except SystemExit as e:
      status = e.code
    finally:
      reset()
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(argv, status, out, err)

  return run


def test_job_evaluates_latest_checkpoint_prints_table_and_writes_json(setup):
  config_path, workdir = setup
  proc = _run_job(f'--config={config_path}', f'--workdir={workdir}')
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'at step 5' in proc.stdout
  assert any(line.split()[:2] == ['digits', '5'] for line in proc.stdout.splitlines())
  with open(workdir / 'fewshot' / 'results.json') as f:
    results = json.load(f)
  assert results['step'] == 5
  assert results['model'] == {'name': 'vit_moe', 'router': 'topk'}
  assert results['model_config']['encoder']['moe']['router']['name'] == 'topk'
  assert 'vit_moe, router topk' in proc.stdout
  assert sorted(results['metrics']) == ['fewshot/digits/1shot', 'fewshot/digits/5shot']
  digits = results['datasets']['digits']
  assert (digits['num_train'], digits['num_test'], digits['num_classes']) == (1437, 360, 10)
  for shot in ('1', '5'):
    r = digits['shots'][shot]
    assert len(r['accuracy']) == len(r['l2_reg']) == 2
    assert r['accuracy_mean'] > 0.2  # chance is 0.1; random ViT features still transfer
  assert not [p for p in os.listdir(workdir / 'fewshot') if p != 'results.json']


def test_run_evaluates_the_requested_step_on_an_expert_sharded_mesh(setup):
  config_path, workdir = setup
  config = config_lib.load_config_file(str(config_path))
  config.unlock()
  config.mesh.expert = 2  # 8 fake devices as 4 x 2: expert parameters split in two.
  payload = job.run(config, str(workdir), step=3)
  assert payload['step'] == 3
  with open(workdir / 'fewshot' / 'results.json') as f:
    assert json.load(f)['step'] == 3
  table = job.format_table(payload)
  assert 'at step 3' in table and 'digits' in table


def _one_line(proc, *expected):
  """Asserts exit status 2 and one stderr line 'PROG: error: ...' holding `expected`."""
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-2000:])
  assert lines[0].startswith(f'{job.PROG}: error: '), lines
  for text in expected:
    assert text in lines[0], lines[0]


def test_missing_checkpoint_fails_clearly(setup, tmp_path, job_in_process):
  config_path, workdir = setup
  proc = job_in_process(f'--config={config_path}', f'--workdir={tmp_path}')
  _one_line(proc, f'--workdir={tmp_path}: No checkpoint directory {tmp_path / "checkpoints"}')
  assert not (tmp_path / 'fewshot').exists()
  with pytest.raises(FileNotFoundError, match='step 4'):
    job.run(config_lib.load_config_file(str(config_path)), str(workdir), step=4)


def test_missing_workdir_config_or_step_is_one_line_exit_2(setup, tmp_path, job_in_process):
  config_path, workdir = setup
  before = sorted(os.listdir(workdir / 'fewshot')) if (workdir / 'fewshot').exists() else []
  _one_line(job_in_process(f'--config={config_path}', f'--workdir={tmp_path}/nope'),
            f"--workdir='{tmp_path}/nope': not a directory")
  _one_line(job_in_process(f'--workdir={workdir}'), 'flag --config is required')
  _one_line(job_in_process(f'--config={config_path}', f'--workdir={workdir}', '--step=4'),
            f'--step=4: No checkpoint for step 4 in {workdir / "checkpoints"}; available '
            'steps: [3, 5]')
  after = sorted(os.listdir(workdir / 'fewshot')) if (workdir / 'fewshot').exists() else []
  assert after == before and not (tmp_path / 'nope').exists()


def test_unknown_dataset_fails_clearly(setup):
  config_path, workdir = setup
  with pytest.raises(transfer.DatasetError, match="'nope' .name='no_such_dataset'"):
    job.run(config_lib.load_config_file(f'{config_path}:bad'), str(workdir))


def test_a_fewshot_folder_that_cannot_hold_the_results_is_refused_before_evaluating(
    setup, tmp_path, job_in_process):
  config_path, workdir = setup
  copy = tmp_path / 'w'
  shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns('fewshot'))
  (copy / 'fewshot').write_text('')  # where fewshot/results.json would go
  _one_line(job_in_process(f'--config={config_path}', f'--workdir={copy}'),
            f"--workdir='{copy}/fewshot': exists and is not a directory")


def test_checkpoint_of_another_model_fails_clearly(setup):
  config_path, workdir = setup
  config = config_lib.load_config_file(str(config_path))
  config.unlock()
  config.model.hidden_size = 24
  with pytest.raises(job.CheckpointMismatchError,
                     match=r'model.hidden_size: config 24, checkpoint 16'):
    job.run(config, str(workdir))


def test_config_naming_another_router_is_refused_with_the_keys(setup):
  config_path, workdir = setup
  before = (workdir / 'fewshot' / 'results.json').read_bytes() if (
      workdir / 'fewshot' / 'results.json').exists() else None
  with pytest.raises(job.CheckpointMismatchError) as info:
    job.run(config_lib.load_config_file(f'{config_path}:sparse_ot'), str(workdir))
  message = str(info.value)
  assert "model.encoder.moe.router.name: config 'sparse_ot', checkpoint 'topk'" in message
  assert '--use_checkpoint_config' in message and '\n' not in message
  # Nothing was written: an earlier results.json is left as it was.
  after = (workdir / 'fewshot' / 'results.json').read_bytes() if (
      workdir / 'fewshot' / 'results.json').exists() else None
  assert before == after


def test_cli_refuses_another_router_then_uses_the_checkpoint_config_with_the_flag(
    setup, job_in_process):
  config_path, workdir = setup
  proc = job_in_process(f'--config={config_path}:sparse_ot', f'--workdir={workdir}',
                        '--step=3')
  _one_line(proc, "model.encoder.moe.router.name: config 'sparse_ot', checkpoint 'topk'",
            '--use_checkpoint_config')
  proc = job_in_process(f'--config={config_path}:sparse_ot', f'--workdir={workdir}',
                        '--step=3', '--use_checkpoint_config')
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'router topk' in proc.stdout
  with open(workdir / 'fewshot' / 'results.json') as f:
    results = json.load(f)
  assert results['step'] == 3
  assert results['model'] == {'name': 'vit_moe', 'router': 'topk'}


def test_cli_missing_fewshot_dataset_fails_before_reading_the_checkpoint(setup, tmp_path,
                                                                         job_in_process):
  config_path, _ = setup
  # tmp_path holds no checkpoint: the dataset check must come first to be reported.
  proc = job_in_process(f'--config={config_path}:bad', f'--workdir={tmp_path}')
  assert proc.returncode == 2
  lines = proc.stderr.strip().splitlines()
  assert lines == [lines[-1]] and "config.fewshot.datasets.nope: dataset 'no_such_dataset'" \
      in lines[-1], proc.stderr

