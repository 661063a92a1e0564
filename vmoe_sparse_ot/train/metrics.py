"""Training metrics averaged on device, and where scalars are written.

`TrainMetrics` accumulates every per-step scalar (loss, accuracy, cross-entropy,
auxiliary loss, gradient norm, routing metrics) as a `clu.metrics.Average` inside
the jitted train step, so the host reads them once per logging interval and what
it reports is the interval's mean, never the last batch's value.

Scalars go to TensorBoard (`clu` SummaryWriter) and to `WORKDIR/metrics.jsonl`,
one JSON object per line and split: {"step": N, "split": "train", "loss": ...}.
Keys 'eval/NAME' are written with split "eval" as NAME, 'fewshot/NAME' with split
"fewshot"; everything else is "train". Nothing goes to the console here: the
trainer prints its own one-line progress.
"""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import flax
import jax
import jax.numpy as jnp
import numpy as np
from clu import metric_writers
from clu import metrics as clu_metrics
from clu.metric_writers import interface

from vmoe_sparse_ot import workdir_layout
from vmoe_sparse_ot import atomic

METRICS_FILE = workdir_layout.METRICS
SPLITS = ('eval', 'fewshot')  # Key prefixes with a split of their own.


@flax.struct.dataclass
class TrainMetrics:
  """Averages of the per-step training scalars since the last reset.

  first_nonfinite_step: int32, the first step whose loss or gradient norm was
    NaN/Inf since the reset, 0 if none: the exact step is known without the host
    looking at every step.
  losses: (N,) float32, the loss of each step since the reset, in order (N is
    the longest interval, `log_every_steps`); the host reads the per-step curve
    once per interval.
  """
  averages: dict[str, clu_metrics.Average]
  first_nonfinite_step: jax.Array
  losses: jax.Array

  @classmethod
  def empty(cls, names, max_steps: int) -> 'TrainMetrics':
    return cls(averages={name: clu_metrics.Average.empty() for name in names},
               first_nonfinite_step=jnp.zeros((), jnp.int32),
               losses=jnp.full((max_steps,), jnp.nan, jnp.float32))

  def update(self, values: Mapping[str, jax.Array], step: jax.Array) -> 'TrainMetrics':
    """Merges one step's scalars (inside jit); `step` is that step's number."""
    averages = {name: self.averages[name].merge(clu_metrics.Average.from_model_output(
        jnp.asarray(values[name], jnp.float32))) for name in self.averages}
    finite = jnp.isfinite(values['loss']) & jnp.isfinite(values['grad_norm'])
    first = jnp.where((self.first_nonfinite_step == 0) & ~finite,
                      jnp.asarray(step, jnp.int32), self.first_nonfinite_step)
    index = self.averages['loss'].count  # Steps merged so far.
    losses = self.losses.at[index].set(jnp.asarray(values['loss'], jnp.float32),
                                       mode='drop')
    return TrainMetrics(averages=averages, first_nonfinite_step=first, losses=losses)

  def compute(self) -> dict[str, float]:
    """{name: mean} on the host (call on fetched, numpy-valued metrics)."""
    return {name: float(np.asarray(avg.total) / max(int(avg.count), 1))
            for name, avg in self.averages.items()}

  def step_losses(self) -> list[float]:
    """The per-step losses since the reset (call on fetched metrics)."""
    return [float(x) for x in np.asarray(self.losses)[:int(self.averages['loss'].count)]]


def split_scalars(scalars: Mapping[str, Any]) -> dict[str, dict[str, float]]:
  """{'train': {...}, 'eval': {...}} from 'eval/loss'-style keys."""
  out: dict[str, dict[str, float]] = {}
  for key, value in scalars.items():
    prefix, _, rest = key.partition('/')
    split, name = (prefix, rest) if prefix in SPLITS and rest else ('train', key)
    out.setdefault(split, {})[name] = float(value)
  return out


class JsonlWriter(interface.MetricWriter):
  """clu MetricWriter appending scalars to a JSON-lines file, one line per split."""

  def __init__(self, path: str):
    self.path = path
    self._file = open(path, 'a', encoding='utf-8')  # pylint: disable=consider-using-with

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    for split, values in split_scalars(scalars).items():
      self._file.write(json.dumps({'step': int(step), 'split': split, **values}) + '\n')

  # Non-scalar summaries and hyperparameters go to TensorBoard and config.json.
  def write_summaries(self, step, values, metadata=None):
    del step, values, metadata

  def write_images(self, step, images):
    del step, images

  def write_videos(self, step, videos):
    del step, videos

  def write_audios(self, step, audios, *, sample_rate):
    del step, audios, sample_rate

  def write_texts(self, step, texts):
    del step, texts

  def write_histograms(self, step, arrays, num_buckets=None):
    del step, arrays, num_buckets

  def write_hparams(self, hparams):
    del hparams

  def flush(self) -> None:
    self._file.flush()

  def close(self) -> None:
    self._file.close()


def drop_records_after(path: str, step: int) -> None:
  """Keeps the records of steps <= `step`: a resumed run rewrites the later ones."""
  if not os.path.exists(path):
    return
  with open(path, encoding='utf-8') as f:
    lines = f.readlines()
  kept = []
  for line in lines:
    try:
      if int(json.loads(line)['step']) <= step:
        kept.append(line)
    except (ValueError, KeyError, TypeError):
      continue  # A line cut short by a kill.
  if len(kept) != len(lines):
    atomic.write_text(path, ''.join(kept))


def make_writer(workdir: str, *, resume_step: int) -> metric_writers.MetricWriter:
  """TensorBoard + metrics.jsonl on process 0; a writer that drops everything elsewhere."""
  if jax.process_index() > 0:
    return metric_writers.MultiWriter([])
  path = os.path.join(workdir, METRICS_FILE)
  drop_records_after(path, resume_step)
  return metric_writers.MultiWriter([metric_writers.SummaryWriter(workdir),
                                     JsonlWriter(path)])
