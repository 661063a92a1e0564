"""workdir_layout: the names of a workdir's files, and whether it holds a checkpoint."""
import os

from vmoe_sparse_ot import workdir_layout


def test_names_and_the_absolute_checkpoints_folder(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert workdir_layout.checkpoints_dir('run') == str(tmp_path / 'run' / 'checkpoints')
  assert workdir_layout.checkpoints_dir('/a/b/') == '/a/b/checkpoints'
  assert workdir_layout.FEWSHOT_RESULTS == os.path.join('fewshot', 'results.json')
  assert (workdir_layout.CONFIG, workdir_layout.METRICS, workdir_layout.LOCK) == (
      'config.json', 'metrics.jsonl', '.lock')


def test_has_checkpoint_needs_a_step_folder(tmp_path):
  workdir = tmp_path / 'w'
  assert not workdir_layout.has_checkpoint(str(workdir))  # no workdir
  (workdir / 'checkpoints').mkdir(parents=True)
  assert not workdir_layout.has_checkpoint(str(workdir))  # empty
  (workdir / 'checkpoints' / 'tmp.orbax').mkdir()
  (workdir / 'checkpoints' / '12.orbax-checkpoint-tmp').mkdir()
  assert not workdir_layout.has_checkpoint(str(workdir))  # no step folder
  (workdir / 'checkpoints' / '12').mkdir()
  assert workdir_layout.has_checkpoint(str(workdir))
