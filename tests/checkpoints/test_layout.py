"""checkpoints.layout: step folders moved aside and unfinished saves removed, on a real disk."""
import os

from vmoe_sparse_ot.checkpoints import layout


def _make(directory, *names):
  for name in names:
    os.makedirs(os.path.join(directory, name, 'params'))


def test_checkpoint_dir_is_the_workdirs_checkpoints_folder(tmp_path):
  assert layout.checkpoint_dir(str(tmp_path)) == os.path.join(str(tmp_path), 'checkpoints')


def test_move_aside_renames_the_step_and_never_overwrites_an_earlier_one(tmp_path, monkeypatch):
  d = str(tmp_path)
  _make(d, '4', '8')
  assert layout.move_aside(d, 8) == os.path.join(d, '8.corrupt')
  assert sorted(os.listdir(d)) == ['4', '8.corrupt']
  assert os.listdir(os.path.join(d, '8.corrupt')) == ['params']   # Contents kept.
  # Step 8 again (a later run saved it anew): the first one set aside stays.
  _make(d, '8')
  monkeypatch.setattr(layout.time, 'time', lambda: 1234.5)
  assert layout.move_aside(d, 8) == os.path.join(d, '8.corrupt-1234')
  assert layout.move_aside(d, 4, layout.DIVERGED_SUFFIX) == os.path.join(d, '4.diverged')
  assert sorted(os.listdir(d)) == ['4.diverged', '8.corrupt', '8.corrupt-1234']


def test_remove_unfinished_saves_deletes_only_orbax_temporary_folders(tmp_path):
  d = str(tmp_path)
  _make(d, '20', '40.corrupt', '60.orbax-checkpoint-tmp-1', '80.orbax-checkpoint-tmp-17')
  assert layout.remove_unfinished_saves(d) == ['60.orbax-checkpoint-tmp-1',
                                               '80.orbax-checkpoint-tmp-17']
  assert sorted(os.listdir(d)) == ['20', '40.corrupt']
  assert layout.remove_unfinished_saves(d) == []
