"""The paper's experiments, one module each; run them with

    python -m vmoe_sparse_ot.experiments NAME [--out DIR] [--quick] [--seeds N]

NAME is one of `NAMES` or `all`. Each module `vmoe_sparse_ot.experiments.NAME`
exposes

    run(out_dir: str, *, quick: bool, seeds: int | None) -> dict
        writes its figure(s) as `out_dir/NAME*.png` and returns a JSON-able payload;
    format_table(payload: dict) -> str
        a short text table of that payload.

The dispatcher (`run_experiment`) seeds numpy/random, writes `out_dir/NAME.json`
and reports the wall time. Modules are imported lazily, so running one
experiment does not import the others' dependencies.
"""
import importlib
import json
import os
import random
import time
from typing import Any

import numpy as np

NAMES = (
    'formulations_2d',
    'smoothness_vs_k',
    'gaussians_1d',
    'solver_comparison',
    'k_convergence',
    'color_transfer',
    'supply_demand',
    'mnist_clustering',
    'router_study',
    'upcycle_finetune',   # Not in the paper: the start-from-weights workflow, measured.
)

DEFAULT_OUT = 'experiments_out'
SEED = 0

# `--quick` runs of the experiments that train: the tiny MNIST V-MoE shrunk
# further (2 blocks, one of them MoE with 4 experts, D=32) on a slice of the data,
# so that a quick run takes seconds per model. It checks the workflow, not the numbers.
QUICK_MODEL = {
    'model.hidden_size': 32,
    'model.encoder.num_layers': 2,
    'model.encoder.num_heads': 2,
    'model.encoder.mlp_dim': 64,
    'model.encoder.moe.num_experts': 4,
    'model.encoder.moe.group_size': 32,
    'dataset.train_split': 'train[:4096]',
    'dataset.shuffle_buffer': 1024,
    'batch_size': 16,
}


def shrink_for_quick(config) -> None:
  """Applies QUICK_MODEL to a tiny-MNIST-based `config` (in place)."""
  with config.unlocked():
    config.update_from_flattened_dict(QUICK_MODEL)


def check_name(name: str) -> str:
  """Returns `name` if it is an experiment; ValueError listing the names otherwise."""
  if name not in NAMES:
    raise ValueError(f"experiment must be one of {', '.join(NAMES)} or all, got {name!r}")
  return name


def load(name: str):
  """Imports and returns the module of experiment `name`.

  Raises ValueError for an unknown name or a known one whose module is absent.
  """
  module = f'vmoe_sparse_ot.experiments.{check_name(name)}'
  try:
    return importlib.import_module(module)
  except ModuleNotFoundError as e:
    if e.name != module:
      raise  # a missing dependency inside the module: show it as it is
    raise ValueError(f'experiment {name!r} is not available in this checkout') from None


def _jsonable(x: Any) -> Any:
  if isinstance(x, dict):
    return {str(k): _jsonable(v) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_jsonable(v) for v in x]
  if isinstance(x, np.ndarray):
    return _jsonable(x.tolist())
  if isinstance(x, np.generic):
    return x.item()
  if hasattr(x, 'tolist'):  # jax arrays
    return _jsonable(np.asarray(x).tolist())
  if isinstance(x, float) and not np.isfinite(x):
    return None  # JSON has no NaN / inf
  return x


def write_json(path: str, payload: dict) -> None:
  """Writes `payload` (numpy / jax values converted, NaN -> null) to `path`."""
  with open(path, 'w') as f:
    json.dump(_jsonable(payload), f, indent=2)
    f.write('\n')


def finished(name: str, out_dir: str, *, quick: bool, seeds: int | None) -> dict | None:
  """The payload of `out_dir/NAME.json` if a run with these settings wrote it, else None.

  The JSON is written last, after the figures, so its presence means the run ended.
  """
  try:
    with open(os.path.join(out_dir, f'{name}.json')) as f:
      payload = json.load(f)
  except (OSError, ValueError):
    return None
  if payload.get('quick') != quick or payload.get('seeds') != seeds:
    return None
  return payload


def run_experiment(name: str, out_dir: str = DEFAULT_OUT, *, quick: bool = False,
                   seeds: int | None = None, resume: bool = False) -> dict:
  """Runs experiment `name`: figures and `out_dir/NAME.json`; returns the payload.

  The payload gains `wall_time_s` (the whole run, compilation included) and
  `quick` / `seeds` (how it was run). `resume`: when `finished` finds the run
  already done in `out_dir`, returns its payload, with `resumed` True, instead.
  """
  module = load(name)
  if seeds is not None and seeds < 1:
    raise ValueError(f'seeds must be a positive integer, got {seeds}')
  if resume:
    done = finished(name, out_dir, quick=quick, seeds=seeds)
    if done is not None:
      return dict(done, resumed=True)
  os.makedirs(out_dir, exist_ok=True)
  random.seed(SEED)
  np.random.seed(SEED)
  start = time.perf_counter()
  payload = module.run(out_dir, quick=quick, seeds=seeds)
  payload = dict(payload, wall_time_s=time.perf_counter() - start, quick=quick, seeds=seeds)
  write_json(os.path.join(out_dir, f'{name}.json'), payload)
  return payload
