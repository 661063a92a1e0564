"""`python -m vmoe_sparse_ot.plot WORKDIR` on a tiny training run's workdir."""
import os

import jax
import numpy as np
import pytest

from tests.train.helpers import small_config
from vmoe_sparse_ot import fewshot as fewshot_job
from vmoe_sparse_ot import plot
from vmoe_sparse_ot.evaluate import transfer
from vmoe_sparse_ot.train import trainer

PNG_MAGIC = b'\x89PNG\r\n\x1a\n'


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
  """10 topk steps of the shrunken tiny config (logged at 5 and 10), then few-shot."""
  workdir = tmp_path_factory.mktemp('plot') / 'run'
  config = small_config(train_steps=10, log_every_steps=5)
  config.unlock()
  config.fewshot.datasets = transfer.transfer_datasets('digits')
  config.fewshot.shots, config.fewshot.seeds = (1, 2), (0, 1)
  trainer.train_and_evaluate(config, str(workdir), devices=jax.devices()[:1])
  fewshot_job.run(config, str(workdir))
  return workdir


def test_read_scalars_has_the_trainer_tags(workdir):
  scalars = plot.read_scalars(str(workdir))
  steps, loss = scalars['loss']
  # The first step is logged on its own (as soon as it ran), then every 5 steps.
  assert list(steps) == [1, 5, 10] and np.all(np.isfinite(loss))
  assert list(scalars['eval/accuracy'][0]) == [10]
  # Two blocks, the second one MoE (every_2): its load scalars are there.
  assert plot._moe_layers(scalars) == ['encoderblock_1']  # pylint: disable=protected-access
  lo = scalars['routing/encoderblock_1/tokens_per_expert_min'][1]
  hi = scalars['routing/encoderblock_1/tokens_per_expert_max'][1]
  assert np.all(lo <= hi)
  # The routing metrics every router reports (nn/routing_metrics.py).
  for name in ('max_load_violation', 'tokens_with_0_experts', 'tokens_with_1_expert',
               'tokens_with_2plus_experts'):
    assert np.all(np.isfinite(scalars[f'routing/encoderblock_1/{name}'][1]))


def test_expert_choices_follow_the_sown_weights(workdir):
  import ml_collections  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot import nn  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot import checkpoints  # pylint: disable=g-import-not-at-top
  params, meta, _ = checkpoints.restore_params_with_meta(str(workdir))
  model_config = ml_collections.ConfigDict(meta['model_config'])
  model = nn.build_model(model_config)
  images = np.random.default_rng(0).uniform(-1, 1, (3, 28, 28, 1)).astype(np.float32)
  choices = plot.expert_choices(model, params, images, 'token')
  assert list(choices) == ['encoderblock_1']
  c = choices['encoderblock_1']
  assert c.shape == (3, 16) and c.min() >= -1 and c.max() < 4
  # The sown (G, S, E) weights: per slot, the combine weight lands on (token, expert);
  # TopK's combine weights are softmax gates of at most K=2 experts, so each token's
  # weights sum to at most 1 and at most 2 are nonzero.
  # Jitted as in plot.expert_choices: the same program gives the same weights.
  _, state = jax.jit(lambda v, x: model.apply(v, x, train=False, mutable=['intermediates']))(
      {'params': params}, images)
  w = np.asarray(state['intermediates']['encoder']['encoderblock_1']['moe']
                 ['expert_weights'][0])
  assert w.ndim == 3 and w.shape[-1] == 4
  assert np.all(w >= 0) and np.all(w.sum(-1) <= 1 + 1e-6)
  assert np.all((w > 0).sum(-1) <= 2)
  flat = w.reshape(-1, 4)[:3 * 17].reshape(3, 17, 4)[:, 1:]
  np.testing.assert_array_equal(c, np.where(flat.sum(-1) > 0, flat.argmax(-1), -1))


def test_plot_command_writes_non_empty_pngs(workdir, tmp_path, capfd):
  # The command's `main`, in-process (tests/test_docs.py runs it as the docs write it).
  out = tmp_path / 'plots'
  plot.main([str(workdir), '--out', str(out), '--num_images', '2'])
  proc = capfd.readouterr()
  names = sorted(os.listdir(out))
  assert names == ['curves.png', 'expert_load.png', 'fewshot.png', 'routing.png']
  from matplotlib import image  # pylint: disable=g-import-not-at-top
  for name in names:
    data = (out / name).read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000, name
    pixels = image.imread(str(out / name))
    assert min(pixels.shape[:2]) > 200 and pixels[..., :3].std() > 0.01, name
  assert [line for line in proc.out.splitlines()] == [
      f'Wrote {out / name}' for name in ('curves.png', 'expert_load.png', 'routing.png',
                                         'fewshot.png')]
  assert proc.err == ''


def test_plot_command_errors_are_one_line(tmp_path, capsys):
  # `python -m vmoe_sparse_ot.plot` is `plot.main()`; its errors, in-process.
  with pytest.raises(SystemExit) as e:
    plot.main([str(tmp_path / 'nope')])
  assert e.value.code == 2
  assert capsys.readouterr().err.strip().splitlines() == [
      f"python -m vmoe_sparse_ot.plot: error: workdir '{tmp_path / 'nope'}' is not a directory"]
  empty = tmp_path / 'empty'
  empty.mkdir()
  with pytest.raises(SystemExit) as e:
    plot.main([str(empty)])
  err = capsys.readouterr().err
  assert e.value.code == 2 and 'nothing to plot' in err
  assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize('args, expected', [
    (['--split=nope'], "--split=nope: dataset 'embedded_mnist' has no split 'nope'"),
    (['--dataset=nope'], "--dataset=nope: dataset 'nope' is neither embedded"),
    (['--data_dir={tmp}/file/d'], "--data_dir='{tmp}/file/d': '{tmp}/file' is a file"),
    (['--out={tmp}/' + 'x' * 300], "--out='{tmp}/" + 'x' * 300 + "': cannot create it"),
    (['--num_imags=2'], 'unrecognized arguments: --num_imags=2'),
    (['--num_images=two'], "argument --num_images: invalid int value: 'two'"),
])
def test_a_bad_flag_is_one_line_before_any_figure_is_written(workdir, tmp_path, capsys, args,
                                                             expected):
  (tmp_path / 'file').write_text('')
  args = [a.replace('{tmp}', str(tmp_path)) for a in args]
  out = [f'--out={tmp_path}/plots'] if not args[0].startswith('--out') else []
  with pytest.raises(SystemExit) as e:
    plot.main([str(workdir), *out, *args])
  lines = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and len(lines) == 1, lines
  assert lines[0].startswith(f'{plot.PROG}: error: ' + expected.replace('{tmp}', str(tmp_path)))
  assert sorted(os.listdir(tmp_path)) == ['file']  # No figure, no output folder.


def test_expert_load_figure_from_new_and_older_scalars(tmp_path):
  steps = np.array([1, 5, 10])
  old = {f'routing/encoderblock_1/{name}': (steps, np.array(values, float)) for name, values in {
      'tokens_per_expert_min': [4, 5, 6], 'tokens_per_expert_mean': [8, 8, 8],
      'tokens_per_expert_max': [12, 11, 10], 'dropped_fraction': [0.1, 0.05, 0.0]}.items()}
  new = dict(old, **{f'routing/encoderblock_1/{name}': (steps, np.array(values, float))
                     for name, values in {
                         'tokens_with_0_experts': [0.1, 0.05, 0.0],
                         'tokens_with_1_expert': [0.5, 0.5, 0.6],
                         'tokens_with_2plus_experts': [0.4, 0.45, 0.4],
                         'max_load_violation': [0.5, 0.375, 0.25]}.items()})
  health = dict(new, **{f'routing/encoderblock_1/{name}': (steps, np.array(values, float))
                        for name, values in {'router_entropy': [2.0, 1.2, 0.4],
                                             'empty_experts': [0, 1, 3]}.items()})
  for name, scalars in (('old', old), ('new', new), ('health', health)):
    path = plot.plot_expert_load(scalars, str(tmp_path / f'{name}.png'), capacity=16)
    with open(path, 'rb') as f:
      assert f.read(8) == PNG_MAGIC


def test_input_geometry_reads_the_position_embedding_or_the_runs_image_size():
  kernel = np.zeros((4, 4, 1, 8), np.float32)
  learned = {'embedding': {'kernel': kernel}, 'encoder': {'pos_embedding': np.zeros((1, 50, 8))}}
  assert plot._input_geometry(learned, 'token') == (28, 1, 4, 50)  # 7 x 7 patches + cls
  sincos = {'embedding': {'kernel': kernel}, 'encoder': {}}   # no learned embedding
  assert plot._input_geometry(sincos, 'gap', 28) == (28, 1, 4, 49)
  with pytest.raises(ValueError, match='no learned position embedding'):
    plot._input_geometry(sincos, 'gap')
