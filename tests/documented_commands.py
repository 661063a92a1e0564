"""Every command that README.md and docs/*.md show, and how tests/test_docs.py checks it.

The keys are the commands as the docs write them (in code blocks, or inline in
backquotes), read by `extract`: `.venv/bin/python` counts as `python`,
continuation lines are joined, a trailing `# comment` is dropped and spaces are
collapsed. tests/test_docs.py fails when a doc shows a command that is not a key
here (add it with its check) and when a key is no longer in any doc.

Each command is checked in the smallest form that still shows what the docs
promise (exit status 0, the lines and files they say it writes):

- `Main`: `python -m vmoe_sparse_ot.main` as written, all of them in one
  interpreter (tests/main_cases.py), in the order listed; training is shrunk by
  SHRINK (appended, so it wins over the command's own step count) and paths
  move into a temporary directory (`localize`).
- `PrintConfig`: a command that needs data or hardware this machine lacks
  (ImageNet, accelerators, a pod): its `--workdir` is replaced by
  `--print_config`, so its config file, arguments and override keys resolve.
- `Job`: another module or script, run as written after the `Main` commands
  (whose workdirs it reads), with `extra` arguments that shrink it; the argparse
  command lines (IN_PROCESS) in the same interpreter, the others as processes.
- `Usage`: a synopsis (`NAME [--out DIR]`); its module's --help must list its flags.
- `Covered`: run by the named test, which must exist.
- `NotHere`: needs what no test machine has (say why).
"""
from __future__ import annotations

import dataclasses
import os
import re

from vmoe_sparse_ot import experiments

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ('README.md', *sorted(f'docs/{f}' for f in os.listdir(os.path.join(ROOT, 'docs'))
                             if f.endswith('.md')))
_PREFIXES = ('bash ', 'python ', '.venv/bin/python ', '.venv/bin/pip ')

# Few-shot on fewer examples, one shot count and seed (scripts/main.sh hands its
# --config.fewshot.* arguments to its few-shot step too).
FEWSHOT_SHRINK = ('--config.fewshot.shots=(1,)', '--config.fewshot.seeds=(0,)',
                  '--config.fewshot.datasets.mnist.train_split=validation[:200]',
                  '--config.fewshot.datasets.mnist.test_split=test[:500]')
# Appended to every trained `Main` command and to scripts/main.sh: two steps of
# the tests' smaller model (tests/train/helpers.SMALL), a slice of the test split.
SHRINK = ('--config.train_steps=2', '--config.log_every_steps=1',
          '--config.dataset.eval_split=test[:200]', '--config.eval_batch_size=100',
          *(f'--config.{k}={v}' for k, v in experiments.QUICK_MODEL.items()
            if k.startswith('model.') or k == 'batch_size'),
          *FEWSHOT_SHRINK)
# Jobs whose command lines argparse reads: run in the `Main` commands' interpreter,
# after them (tests/main_cases.py).
IN_PROCESS = ('python -m vmoe_sparse_ot.plot ', 'python -m vmoe_sparse_ot.export ',
              'python -m vmoe_sparse_ot.data', 'python -m vmoe_sparse_ot.evaluate --workdir=')


@dataclasses.dataclass(frozen=True)
class Main:
  stdout: tuple[str, ...] = ()  # regexes the output must match (stdout and stderr)
  files: tuple[str, ...] = ()  # paths (localized) that must exist afterwards
  subs: tuple[tuple[str, str], ...] = ()  # text -> replacement, before `localize`


@dataclasses.dataclass(frozen=True)
class PrintConfig:
  keys: tuple[str, ...] = ()  # 'dotted.key=value' the printed config must hold
  subs: tuple[tuple[str, str], ...] = ()
  files: tuple[str, ...] = ()  # none: printing writes nothing


@dataclasses.dataclass(frozen=True)
class Job:
  extra: tuple[str, ...] = ()
  stdout: tuple[str, ...] = ()
  files: tuple[str, ...] = ()
  subs: tuple[tuple[str, str], ...] = ()  # placeholder -> value, before `localize`
  env: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class Usage:
  module: str
  flags: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Covered:
  test: str  # 'tests/path.py::test_name'


@dataclasses.dataclass(frozen=True)
class NotHere:
  why: str


_TINY = 'python -m vmoe_sparse_ot.main --config=configs/vmoe_tiny_mnist.py'
_CKPT = 'checkpoints'
_FINAL = r'Final test\S* accuracy at step 2: [\d.]+%'
_README_WORKDIR = 'workdirs/vmoe_tiny_mnist_sparse_ot'

COMMANDS = {
    # --- training, in one interpreter, in this order ---
    # Runs of one router share their compiled programs (in-process, and with
    # scripts/main.sh through the session's compilation cache).
    f'{_TINY} --workdir=/tmp/run': Main((_FINAL,), ('/tmp/run/checkpoints/2',)),
    f'{_TINY} --print_config': Main(('"name": "sparse_ot"', '"image_size": 28')),
    # The README's training with another router, in the short and the long form: the
    # router is set (every router's training is tests/train/test_routers.py's).
    f'{_TINY}:router=sbase --workdir=/tmp/sbase': PrintConfig(
        ('model.encoder.moe.router.name=sbase',)),
    f'{_TINY}:router=topk --workdir=/tmp/run': PrintConfig(
        ('model.encoder.moe.router.name=topk',)),
    f'{_TINY} --config.model.encoder.moe.router.name=sbase --config.train_steps=300 '
    '--workdir=/tmp/run2': PrintConfig(('model.encoder.moe.router.name=sbase', 'train_steps=300')),
    f'{_TINY} --workdir=workdirs/dense --config.model.name=vit': Main(
        (_FINAL,), ('workdirs/dense/checkpoints/2',)),
    f'{_TINY}:router=sparse_ot --workdir=workdirs/upcycled '
    '--config.initialization.path=workdirs/dense': Main(
        (_FINAL,), ('workdirs/upcycled/checkpoints/2',)),
    # E³ fine-tuned from a V-MoE workdir (docs/E3.md): from the upcycled run above, whose
    # sparse_ot V-MoE has the same parameters as the documented topk one (the topk
    # training itself: tests/train/test_routers.py).
    'python -m vmoe_sparse_ot.main --config=configs/vmoe_tiny_mnist.py:router=topk '
    '--workdir=workdirs/vmoe_topk': PrintConfig(('model.encoder.moe.router.name=topk',)),
    'python -m vmoe_sparse_ot.main --config=configs/e3_tiny_mnist.py:init=workdirs/vmoe_topk '
    '--workdir=workdirs/e3': Main(
        (_FINAL,), ('workdirs/e3/checkpoints/2',),
        subs=(('init=workdirs/vmoe_topk', 'init=workdirs/upcycled'),)),
    # --- what needs ImageNet, a checkpoint or a pod: the config resolves ---
    'python -m vmoe_sparse_ot.main --config=configs/vmoe_b16.py:dataset=imagenet21k,'
    'data_dir=/data/tfds --workdir=W --config.dataset.pp_train="decode_jpeg_and_inception_'
    "crop(224)|flip_lr|randaug(2, 20)|value_range(-1, 1)|onehot(21843, key='label', "
    "key_result='labels')\" --config.loss.name=sigmoid_xent --config.mixup.p=0.5 "
    '--config.microsteps=4 --config.optimizer.mu_dtype=bfloat16': PrintConfig(
        ('model.num_classes=21843', 'loss.name=sigmoid_xent', 'microsteps=4')),
    'python -m vmoe_sparse_ot.main --workdir=workdirs/ft --config=configs/vmoe_b16_ft_'
    'imagenet.py:init=/ckpts/vmoe_b16_imagenet21k_randaug_strong,data_dir=/data/tfds':
        PrintConfig(('dataset.image_size=384',
                     'dataset.pp_eval=decode|resize(384)|value_range(-1, 1)')),
    'python -m vmoe_sparse_ot.main --config=configs/vmoe_b16_ft_imagenet.py:init=/ckpts/'
    'vmoe_b16_imagenet21k_randaug_strong,data_dir=/data/tfds --workdir=workdirs/vmoe_b16_ft':
        PrintConfig(('initialization.path=/ckpts/vmoe_b16_imagenet21k_randaug_strong',)),
    'python -m vmoe_sparse_ot.main --config=configs/vmoe_b32.py:data_dir=/data/tfds '
    '--workdir=/mnt/nfs/runs/b32 --coordinator_address=HOST0:12345 --num_processes=N '
    '--process_id=I': PrintConfig(('model.patch_size=[32, 32]', 'dataset.data_dir=/data/tfds'),
                                  subs=(('=N ', '=2 '), ('=I', '=0'), ('HOST0', '127.0.0.1'))),
    'python -m vmoe_sparse_ot.main --config=configs/NAME.py --workdir=DIR': PrintConfig(),
    # A config file of the reference code, translated: its keys, overrides, refusals.
    'python -m vmoe_sparse_ot.main --config=FILE[:ARG] --workdir=W': Covered(
        'tests/config/test_reference.py::'
        'test_a_key_with_no_mapping_exits_2_in_one_line_and_writes_nothing'),
    'PYTHONPATH=/path/to/vmoe .venv/bin/python -m vmoe_sparse_ot.main --config=/path/to/vmoe/'
    'vmoe/configs/vmoe_paper/vmoe_s32_last2_ilsvrc2012_randaug_light1.py --workdir=W '
    '--config.dataset.train.batch_size=1024': Covered(
        'tests/config/test_reference.py::'
        'test_the_shrunk_reference_run_script_resolves_its_overrides'),
    'bash scripts/reference_s32_embedded.sh /path/to/vmoe': Covered(
        'tests/config/test_reference.py::'
        'test_the_shrunk_reference_run_script_resolves_its_overrides'),
    'python -m vmoe_sparse_ot.main': Usage('vmoe_sparse_ot.main', (
        '--config', '--workdir', '--print_config', '--coordinator_address')),
    # --- jobs on the workdirs above ---
    # The quickstart: trains, few-shot, plots.
    'bash scripts/main.sh --config.train_steps=300': Job(
        extra=SHRINK, env=(('WORKDIR', _README_WORKDIR),),
        stdout=(_FINAL, r'Few-shot .* over 1 seed\(s\)', r'Wrote .*/plots/routing\.png'),
        files=(f'{_README_WORKDIR}/checkpoints/2', f'{_README_WORKDIR}/fewshot/results.json',
               f'{_README_WORKDIR}/plots/curves.png', f'{_README_WORKDIR}/plots/fewshot.png')),
    'python -m vmoe_sparse_ot.plot /tmp/run': Job(files=(
        '/tmp/run/plots/curves.png', '/tmp/run/plots/routing.png')),
    'python -m vmoe_sparse_ot.plot workdirs/vmoe_tiny_mnist_sparse_ot [--out DIR]': Job(
        subs=(('workdirs/vmoe_tiny_mnist_sparse_ot', 'workdirs/upcycled'),
              ('[--out DIR]', '--out /tmp/upcycled_plots')),
        files=('/tmp/upcycled_plots/curves.png',)),
    'python -m vmoe_sparse_ot.export workdirs/upcycled upcycled.npz': Job(
        files=('upcycled.npz',)),
    # The same flags on another workdir, with its console and JSON checked line by line.
    'python -m vmoe_sparse_ot.evaluate --workdir=workdirs/upcycled --capacity_factor=0.5 '
    '--batch_priority': Covered(
        'tests/evaluate/test_job.py::test_command_line_end_to_end_on_two_devices'),
    # A reference partitioned checkpoint and its config on a registered remote file system.
    'python -m vmoe_sparse_ot.evaluate --checkpoint=PREFIX_OR_NPZ --config=FILE '
    '--dataset=NAME --split=SPLIT': Covered(
        'tests/evaluate/test_job.py::'
        'test_checkpoint_without_workdir_through_a_remote_file_system'),
    'python -m vmoe_sparse_ot.evaluate --checkpoint=PREFIX_OR_NPZ --config=FILE': Covered(
        'tests/evaluate/test_job.py::'
        'test_checkpoint_without_workdir_through_a_remote_file_system'),
    # Another router than the one trained (/tmp/run trains sparse_ot).
    'python -m vmoe_sparse_ot.evaluate --workdir=W --split=test --router=sparse_ot': Job(
        subs=(('=W ', '=/tmp/run '), ('--router=sparse_ot', '--router=topk')),
        extra=('--split=test[:500]',), stdout=(r'top-1', r'topk')),
    # The same flags on a shrunken run, its table and results.json checked.
    'python -m vmoe_sparse_ot.fewshot --config=configs/vmoe_tiny_mnist.py '
    f'--workdir={_README_WORKDIR}': Covered(
        'tests/test_fewshot.py::'
        'test_job_evaluates_latest_checkpoint_prints_table_and_writes_json'),
    'bash scripts/main.sh': Covered(
        'tests/test_docs.py::test_documented_command[bash scripts/main.sh --config.train_steps=300]'),
    'python -m vmoe_sparse_ot.quickstart': Covered(
        'tests/test_docs.py::test_documented_command[bash scripts/main.sh --config.train_steps=300]'),
    'python -m vmoe_sparse_ot.data': Job(stdout=()),
    'python -m vmoe_sparse_ot.data --help': Job(stdout=('--data_dir',)),
    'python -m vmoe_sparse_ot.data [NAME ...] [--data_dir DIR]': Usage(
        'vmoe_sparse_ot.data', ('--data_dir',)),
    'python -m vmoe_sparse_ot.export WORKDIR OUT.npz [--step N] [--naming vit|vmoe|ours]':
        Usage('vmoe_sparse_ot.export', ('--step', '--naming')),
    'python -m vmoe_sparse_ot.plot WORKDIR [--out DIR]': Usage('vmoe_sparse_ot.plot', ('--out',)),
    'python -m vmoe_sparse_ot.plot WORKDIR': Covered(
        'tests/test_docs.py::test_documented_command[python -m vmoe_sparse_ot.plot /tmp/run]'),
    'python -c "import jax; print(jax.devices())"': Job(stdout=(r'CpuDevice',)),
    # --- experiments: each module's --quick test, and `all --quick` ---
    'python -m vmoe_sparse_ot.experiments NAME [--out DIR] [--quick] [--seeds N]': Usage(
        'vmoe_sparse_ot.experiments', ('--out', '--quick', '--seeds')),
    'python -m vmoe_sparse_ot.experiments all': Covered(
        'tests/experiments/test_all.py::test_all_quick_writes_every_json_and_png'),
    'bash scripts/upcycle_finetune.sh': Covered(
        'tests/experiments/test_upcycle_finetune.py::test_script_quick_writes_table_json_and_png'),
    **{f'python -m vmoe_sparse_ot.experiments {name}': Covered(
        f'tests/experiments/test_{name}.py') for name in (
            'formulations_2d', 'smoothness_vs_k', 'gaussians_1d', 'solver_comparison',
            'k_convergence', 'color_transfer', 'supply_demand', 'router_study')},
    'python -m vmoe_sparse_ot.experiments mnist_clustering --seeds 20': Covered(
        'tests/experiments/test_mnist_clustering.py'),
    # --- set-up, the suite itself, accelerators ---
    'bash scripts/setup.sh': Covered('tests/test_docs.py::test_setup_is_idempotent'),
    'bash scripts/test.sh': NotHere('the suite itself: CI runs it (.ci/run) on a fresh clone'),
    '.venv/bin/pip install -e ".[cuda12]"': NotHere('installs CUDA wheels for an NVIDIA GPU'),
    '.venv/bin/pip install -e ".[tpu]"': NotHere('installs TPU wheels for a Cloud TPU VM'),
    'bash benchmarks/gpu.sh': NotHere('runs on a GPU machine (benchmarks/RESULTS.md)'),
}


def _clean(command: str) -> str:
  command = re.sub(r'\s{2,}#.*$', '', command.strip())
  command = re.sub(r'^\.venv/bin/python ', 'python ', command)
  return ' '.join(command.split())


def extract(text: str) -> list[str]:
  """The commands a Markdown text shows, normalized (see the module docstring)."""
  out = []
  lines = text.splitlines()
  fenced = False
  i = 0
  while i < len(lines):
    line = lines[i]
    if line.lstrip().startswith('```'):
      fenced = not fenced
    elif fenced:
      stripped = line.strip()
      # `python -m X: error: ...` is a console line the docs quote, not a command.
      # Leading environment assignments (`PYTHONPATH=... python -m ...`) belong to it.
      command = re.sub(r'^(?:[A-Z_][A-Z0-9_]*=\S+\s+)+', '', stripped)
      if command.startswith(_PREFIXES) and not re.match(r'python -m [\w.]+: ', command):
        parts = [stripped]
        while parts[-1].endswith('\\') and i + 1 < len(lines):
          parts[-1] = parts[-1][:-1]
          i += 1
          parts.append(lines[i].strip())
        out.append(_clean(' '.join(parts)))
    else:
      out.extend(_clean(span) for span in re.findall(r'`([^`\n]+)`', line)
                 if span.startswith(_PREFIXES))
    i += 1
  return out


def documented() -> dict[str, list[str]]:
  """{command: [doc files showing it]} over README.md and docs/*.md."""
  found: dict[str, list[str]] = {}
  for doc in DOCS:
    with open(os.path.join(ROOT, doc)) as f:
      for command in extract(f.read()):
        found.setdefault(command, [])
        if doc not in found[command]:
          found[command].append(doc)
  return found


def localize(command: str, tmp: str) -> str:
  """`command` with the paths it writes moved under `tmp` (configs/ and scripts/ stay)."""
  command = re.sub(r'(?<=[\s=])/tmp/', f'{tmp}/tmp/', command)
  command = re.sub(r'(?<=[\s=])workdirs/', f'{tmp}/workdirs/', command)
  command = re.sub(r'(?<=\s)(\w+\.npz)', rf'{tmp}/\1', command)
  return command


def local_path(path: str, tmp: str) -> str:
  """A `files` entry of a check, localized as `localize` moves the command's paths."""
  return localize(' ' + path, tmp)[1:]
