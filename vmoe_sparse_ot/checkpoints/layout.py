"""Where a workdir's checkpoints live on disk, and what each step folder holds.

`WORKDIR/checkpoints/N/` for step N, with the items in ITEMS (see the package
docstring); `N.orbax-checkpoint-tmp*` while a save is in flight (a folder left by a
killed save is removed at the next start); `N.corrupt` for a step moved aside
because it does not restore, `N.diverged` for one whose parameters led to a
non-finite loss. Orbax lists only the integer-named folders, so a restart never
resumes from a step moved aside.
"""
from __future__ import annotations

import glob
import os
import shutil
import time

from vmoe_sparse_ot import workdir_layout

ITEMS = ('params', 'state', 'meta', 'model_state')
TMP_PATTERN = '*.orbax-checkpoint-tmp*'
CORRUPT_SUFFIX = '.corrupt'    # a step that does not restore
DIVERGED_SUFFIX = '.diverged'  # a step whose parameters gave a non-finite loss


def checkpoint_dir(workdir: str) -> str:
  return workdir_layout.checkpoints_dir(workdir)


def move_aside(directory: str, step: int, suffix: str = CORRUPT_SUFFIX) -> str:
  """Renames step folder `step` of `directory` to `step` + `suffix`; returns the new path."""
  target = os.path.join(directory, f'{step}{suffix}')
  if os.path.exists(target):
    target += f'-{int(time.time())}'
  os.rename(os.path.join(directory, str(step)), target)
  return target


def remove_unfinished_saves(directory: str) -> list[str]:
  """Deletes `*.orbax-checkpoint-tmp*` folders left by a save that never completed."""
  removed = []
  for path in sorted(glob.glob(os.path.join(directory, TMP_PATTERN))):
    shutil.rmtree(path, ignore_errors=True)
    removed.append(os.path.basename(path))
  return removed
