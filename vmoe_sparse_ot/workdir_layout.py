"""What a training workdir holds, named once; every job finds its files through here.

    WORKDIR/
      checkpoints/N/       the Orbax checkpoint of step N (`checkpoints.layout`)
      config.json          the run's resolved config (rewritten on resume)
      summary.json         the final evaluation and throughput
      metrics.jsonl        every logged scalar, one JSON line per step (and TensorBoard
                           event files beside it)
      eval/NAME.json       `python -m vmoe_sparse_ot.evaluate` results
      fewshot/results.json `python -m vmoe_sparse_ot.fewshot` results
      plots/*.png          `python -m vmoe_sparse_ot.plot`
      .lock                held by the trainer that owns the workdir
"""
from __future__ import annotations

import os

CHECKPOINTS = 'checkpoints'
CONFIG = 'config.json'
SUMMARY = 'summary.json'
METRICS = 'metrics.jsonl'
EVAL_DIR = 'eval'
FEWSHOT_RESULTS = os.path.join('fewshot', 'results.json')
PLOTS = 'plots'
LOCK = '.lock'


def checkpoints_dir(workdir: str) -> str:
  """WORKDIR/checkpoints, absolute."""
  return os.path.join(os.path.abspath(workdir), CHECKPOINTS)


def has_checkpoint(workdir: str) -> bool:
  """Whether WORKDIR/checkpoints holds at least one step folder."""
  directory = os.path.join(workdir, CHECKPOINTS)
  return os.path.isdir(directory) and any(name.isdigit() for name in os.listdir(directory))
