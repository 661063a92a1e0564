"""`python -m vmoe_sparse_ot.evaluate`: checkpoint evaluation with eval-time routing overrides."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.evaluate.conftest import EVAL_BATCH, tiny_config
from tests.train.helpers import ROOT
from vmoe_sparse_ot.evaluate import job
from tests.xla_flags import xla_flags

PROG = 'python -m vmoe_sparse_ot.evaluate'


def _brute_force(routes, num_examples):
  """The job's routing statistics, counted from `load(...).routing()` over the same images."""
  out = {}
  for layer, r in routes.items():
    experts = r['experts'][:num_examples]                     # (B, N, K)
    taken = np.stack([np.any(experts == e, axis=-1) for e in range(4)], -1)   # (B, N, E)
    tokens = experts.shape[0] * experts.shape[1]
    out[layer] = {'dropped_fraction': float(np.mean(experts[..., 0] < 0)),
                  'expert_tokens': [int(v) for v in taken.sum((0, 1))], 'num_tokens': tokens}
  return out


def test_command_line_end_to_end_on_two_devices(workdir, eval_data, loaded):
  """One run at capacity factor 0.5 with batch priority; its routing statistics against a
  brute-force count over `load(...).routing()` of the same images (`load` pads its last
  batch with zero images, as the eval pipeline does, so its groups are the job's)."""
  images, labels = eval_data
  env = dict(os.environ, XLA_FLAGS=xla_flags(2))
  proc = subprocess.run(
      [sys.executable, '-m', 'vmoe_sparse_ot.evaluate', f'--workdir={workdir}',
       '--capacity_factor=0.5', '--batch_priority'],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stderr.strip() == '', proc.stderr[-3000:]  # A quiet console.
  path = workdir / 'eval' / 'embedded_mnist-test_200-cf0.5-bpr.json'
  lines = proc.stdout.strip().splitlines()
  assert lines[0] == (f'Evaluated {workdir} at step 4 on embedded_mnist test[:200] '
                      '(200 examples, batch 64, mesh data=1 x expert=2)')
  assert lines[1] == ('Model vit_moe trained with router topk; evaluated with router topk '
                      '(capacity_factor 0.5, batch_priority): K=2, C=8 slots per expert and '
                      'group of S=32 tokens, E=4')
  assert lines[2].startswith('loss ') and 'top-1 accuracy' in lines[2]
  assert lines[3].split()[:3] == ['MoE', 'layer', 'dropped']
  assert lines[-1] == f'Wrote {path}'
  with open(path) as f:
    payload = json.load(f)
  assert payload['name'] == 'embedded_mnist-test_200-cf0.5-bpr' and payload['step'] == 4
  assert payload['dataset'] == {'name': 'embedded_mnist', 'split': 'test[:200]', 'data_dir': None,
                                'num_examples': 200, 'batch_size': 64, 'image_shape': [28, 28, 1]}
  assert payload['mesh'] == {'data': 1, 'expert': 2}
  assert payload['overrides'] == {'capacity_factor': 0.5, 'batch_priority': True}
  assert payload['model'] == {'name': 'vit_moe', 'router': 'topk', 'trained_router': 'topk'}
  assert payload['routing_config'] == {
      'router': 'topk', 'num_selected_experts': 2, 'capacity_factor': 0.5, 'capacity': None,
      'batch_priority': True, 'num_experts': 4, 'group_size': 32, 'buffer_capacity': 8}
  router = payload['model_config']['encoder']['moe']['router']
  assert (router['capacity_factor'], router['batch_priority']) == (0.5, True)

  m = loaded(capacity_factor=0.5, batch_priority=True)
  expected = _brute_force(m.routing(images), 200)
  as_trained = _brute_force(loaded().routing(images), 200)          # capacity factor 1.0
  rows = lines[4:-1]
  assert [row.split()[0] for row in rows] == list(payload['routing']) == [
      'encoderblock_0', 'encoderblock_1']
  for row, (layer, r) in zip(rows, payload['routing'].items()):
    assert row.split()[1:] == [f"{100 * r['dropped_fraction']:.2f}%",
                               f"{r['experts_per_token']:.3f}",
                               *[f'{v:.3f}' for v in r['expert_load']]]
    # Two devices (experts split in two) against `load`'s one: the same routing.
    assert r['num_tokens'] == 200 * 17 == expected[layer]['num_tokens']
    assert r['expert_tokens'] == expected[layer]['expert_tokens']
    assert r['dropped_fraction'] == pytest.approx(expected[layer]['dropped_fraction'], abs=1e-12)
    assert r['dropped_fraction'] > as_trained[layer]['dropped_fraction']
    np.testing.assert_allclose(r['expert_load'], np.array(r['expert_tokens']) / 3400)
    assert r['experts_per_token'] == pytest.approx(sum(r['expert_load']))
  logits = m.predict(images)
  metrics = payload['metrics']
  assert metrics['num_examples'] == 200
  assert metrics['accuracy'] == pytest.approx(np.mean(logits.argmax(-1) == labels))
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  assert metrics['loss'] == pytest.approx(-log_p[np.arange(200), labels].mean(), rel=1e-5)
  assert os.listdir(workdir / 'eval') == [path.name]  # No temporary file left.


def _fails(argv, capsys, *expected):
  """Runs `job.main` in-process: exit status 2, one stderr line holding `expected`."""
  with pytest.raises(SystemExit) as info:
    job.main([PROG, *argv])
  assert info.value.code == 2
  lines = capsys.readouterr().err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f'{PROG}: error: '), lines
  for text in expected:
    assert text in lines[0], lines[0]
  return lines[0]


@pytest.mark.parametrize('args, expected', [
    (['--step=3'], ['--step=3: No checkpoint for step 3', 'available steps: [2, 4]']),
    (['--router=nope'],
     ["--router='nope': unknown router; valid: expert_choice, kl_ot, l2_ot, sbase"]),
    (['--capacity_factor=0'], ['--capacity_factor=0.0: must be a finite number > 0']),
    (['--capacity_factor=-0.5'], ['--capacity_factor=-0.5: must be a finite number > 0']),
    (['--capacity_factor=half'], ["flag --capacity_factor=half: could not convert string to "
                                  "float: 'half'"]),
    (['--num_selected_experts=5'], ['--num_selected_experts=5: must be <= 4']),
    (['--router=soft_moe'], ["--router='soft_moe': the checkpoint's parameters do not fit"]),
    (['--dataset=no_such_dataset'], ["--dataset=no_such_dataset: dataset 'no_such_dataset' is "
                                     'neither embedded']),
    (['--split=nope'], ["--split=nope: dataset 'embedded_mnist' has no split 'nope'"]),
    (['--batch_size=60'], ['--batch_size=60: must be a multiple of the number of devices (8)']),
    (['--name=../x'], ["--name='../x': must be a file name"]),
    (['--workdir_typo=1'], ["Unknown command line flag 'workdir_typo'"]),
])
def test_bad_input_is_one_line_and_exit_status_2_before_anything_is_written(
    workdir, capsys, args, expected):
  before = sorted(os.listdir(workdir / 'eval')) if (workdir / 'eval').exists() else []
  _fails([f'--workdir={workdir}', *args], capsys, *expected)
  after = sorted(os.listdir(workdir / 'eval')) if (workdir / 'eval').exists() else []
  assert after == before


def test_missing_workdir_or_checkpoint(tmp_path, capsys):
  _fails([], capsys, 'flag --workdir is required')
  _fails([f'--workdir={tmp_path / "nope"}'], capsys, f"--workdir='{tmp_path / 'nope'}': "
         'not a directory')
  _fails([f'--workdir={tmp_path}'], capsys, f'No checkpoint directory {tmp_path}/checkpoints')
  assert os.listdir(tmp_path) == []


def test_an_eval_folder_that_cannot_hold_the_results_is_refused_before_evaluating(
    workdir, tmp_path, capsys):
  copy = tmp_path / 'w'
  shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns('eval'))
  (copy / 'eval').write_text('')  # where W/eval/NAME.json would go
  _fails([f'--workdir={copy}'], capsys, f"--workdir='{copy}/eval': exists and is not a "
         'directory')
  assert (copy / 'eval').read_text() == ''


def test_settings_come_from_the_run_then_config_then_flags(workdir, tmp_path):
  request = job.prepare(str(workdir), 2, router='sparse_ot', num_selected_experts=1)
  assert (request.step, request.dataset, request.split, request.batch_size, request.augment,
          request.pp) == (2, 'embedded_mnist', 'test[:200]', EVAL_BATCH, None,
                          'decode(channels=1)|resize(28)|value_range(-1, 1)')  # The run's pp_eval.
  assert request.name == 'embedded_mnist-test_200-sparse_ot-k1-step2'
  assert request.path == str(workdir / 'eval' / f'{request.name}.json')
  config = tiny_config()
  config.unlock()
  config.dataset.eval_split = 'test[:100]'
  config.eval_batch_size = 32
  request = job.prepare(str(workdir), config=config, split='validation[:64]', name='mine')
  assert (request.split, request.batch_size, request.name) == ('validation[:64]', 32, 'mine')
  assert job.prepare(str(workdir), config=config).split == 'test[:100]'
  config.model.encoder.moe.router.capacity_factor = 0.5
  with pytest.raises(job.UsageError, match=r"--config: config.model differs from the "
                     r"checkpoint's model config \(model.encoder.moe.router.capacity_factor: "
                     r'config 0.5, checkpoint 1.0\).*--capacity_factor'):
    job.prepare(str(workdir), config=config)


def _to_remote(local_prefix, remote_folder):
  """The checkpoint's files and a config file for its model, copied into the in-memory
  remote file system; returns (remote prefix, remote config path)."""
  from tests import memory_fs
  from tests.evaluate.conftest import CONFIG_TEXT
  folder, base = os.path.split(local_prefix)
  for name in os.listdir(folder):
    memory_fs.put_file(f'{remote_folder}/{name}', os.path.join(folder, name))
  memory_fs.put(f'{remote_folder}/tiny.py', CONFIG_TEXT.encode())
  return f'{remote_folder}/{base}', f'{remote_folder}/tiny.py'


def test_checkpoint_without_workdir_through_a_remote_file_system(
    released, eval_data, loaded, capsys, tmp_path, monkeypatch):
  """A reference partitioned checkpoint and its config file on a remote file system
  (tests/memory_fs.py): the same accuracy and loss as the workdir's model gives through
  `load(workdir).predict`, the report on stdout with the results as a JSON line, and
  nothing written, remote or local."""
  from tests import memory_fs
  memory_fs.reset()
  prefix, config = _to_remote(released[0], 'memtest://released')
  before = memory_fs.listing('memtest://released')
  assert before == ['tiny.py', 'vmoe_tiny.data-00000-of-00002', 'vmoe_tiny.data-00001-of-00002',
                    'vmoe_tiny.index']
  monkeypatch.chdir(tmp_path)
  job.main([PROG, f'--checkpoint={prefix}', f'--config={config}', f'--batch_size={EVAL_BATCH}'])
  captured = capsys.readouterr()
  assert captured.err.strip() == '', captured.err[-3000:]
  lines = captured.out.strip().splitlines()
  assert lines[0] == (f'Evaluated {prefix} on embedded_mnist test[:200] (200 examples, batch '
                      '64, mesh data=2 x expert=4)')
  assert lines[1].startswith('Model vit_moe trained with router topk; evaluated with router '
                             'topk (as trained): K=2, C=16')
  payload = json.loads(lines[-1])
  assert (payload['workdir'], payload['step'], payload['checkpoint']) == (None, None, prefix)
  assert payload['name'] == 'embedded_mnist-test_200'
  assert payload['dataset']['num_examples'] == 200
  assert 'checkpoint_entries_ignored' not in payload
  images, labels = eval_data
  logits = loaded().predict(images)
  assert payload['metrics']['accuracy'] == pytest.approx(np.mean(logits.argmax(-1) == labels))
  log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  assert payload['metrics']['loss'] == pytest.approx(-log_p[np.arange(200), labels].mean(),
                                                     rel=1e-5)
  assert lines[2] == (f"loss (softmax_xent) {payload['metrics']['loss']:.4f}, top-1 accuracy "
                      f"{100 * payload['metrics']['accuracy']:.2f}%")
  assert memory_fs.listing('memtest://released') == before   # Nothing beside the checkpoint.
  assert os.listdir(tmp_path) == []                            # Nor here.
  memory_fs.reset()


def test_checkpoint_bad_input_is_one_line(released, workdir, tmp_path, capsys):
  from tests import memory_fs  # noqa: F401  (registers memtest://, also when run alone)
  from tests.evaluate.conftest import CONFIG_TEXT
  prefix = released[0]
  config = tmp_path / 'tiny.py'
  config.write_text(CONFIG_TEXT)
  _fails([f'--checkpoint={tmp_path}/nope', f'--config={config}'], capsys,
         f'--checkpoint: {tmp_path}/nope does not exist')
  _fails(['--checkpoint=memtest://nowhere/ckpt', f'--config={config}'], capsys,
         '--checkpoint: memtest://nowhere/ckpt does not exist')
  _fails([f'--workdir={workdir}', f'--checkpoint={prefix}'], capsys,
         '--workdir and --checkpoint: give one of them')
  _fails([f'--checkpoint={prefix}'], capsys, f'--checkpoint={prefix}: needs --config')
  _fails([f'--checkpoint={prefix}', f'--config={config}', '--step=4'], capsys,
         '--step=4: applies to --workdir only')
  _fails([f'--checkpoint={prefix}', f'--config={tmp_path}/nope.py'], capsys,
         f"--config={tmp_path}/nope.py: config file '{tmp_path}/nope.py' not found")
  assert sorted(os.listdir(tmp_path)) == ['tiny.py']
