"""Compute accounting of the train step: XLA's FLOP count, device-seconds, MFU.

Every train row of metrics.jsonl carries

- `flops_per_step`: XLA's cost analysis of the compiled train step
  (`jitted.lower(...).compile().cost_analysis()['flops']`), counted **per
  device**: under the ('data', 'expert') mesh the program XLA analyses is the
  partitioned one each device runs. One number per run: the program is the
  same every step.
- `device_seconds_per_step`: wall seconds per step times the devices of the
  mesh (all processes), on the rows that time steps (not the first, compiling
  one);
- `mfu`: model FLOPs utilization, flops_per_step / (seconds per step x peak
  FLOP/s of one device), on those rows, when the peak is known:
  `config.peak_flops_per_device`, else the device's entry in `PEAK_FLOPS`
  (none on CPU, so no `mfu` there).

What the count is: the FLOPs of the HLO that runs, as XLA counts them. It
includes the backward pass, the optimizer update, the router and any
recomputation `model.remat` asks for (so with remat this is closer to hardware
FLOPs than to the model's). XLA counts a loop's body once, whatever its trip
count: a step whose work sits in a `lax.scan` or `fori_loop` (microsteps > 1:
one microbatch's forward and backward; an iterative router's solver: one of
its iterations) is undercounted, and its `mfu` with it. Compare FLOPs across
runs with the same loops.
"""
from __future__ import annotations

import re
from typing import Any, Callable

# Peak dense bfloat16 FLOP/s of one JAX device, from the vendors' spec sheets
# (tensor-core / matrix-unit numbers without structured sparsity): (pattern
# searched in the lower-cased `device_kind`, FLOP/s, what it is). First match
# wins, so a more specific pattern comes first. On TPU v2 and v3 a JAX device is
# one of the chip's two cores: half the chip's peak.
PEAK_FLOPS = (
    (r'h100.*pcie', 756e12, 'NVIDIA H100 PCIe'),
    (r'h100.*nvl', 835e12, 'NVIDIA H100 NVL'),
    (r'h100|h200', 989e12, 'NVIDIA H100 SXM, H200, GH200'),
    (r'a100', 312e12, 'NVIDIA A100'),
    (r'l40s', 362e12, 'NVIDIA L40S'),
    (r'\bl4\b', 121e12, 'NVIDIA L4'),
    (r'tpu v2', 22.5e12, 'TPU v2, one core'),
    (r'tpu v3', 61.5e12, 'TPU v3, one core'),
    (r'tpu v4', 275e12, 'TPU v4 chip'),
    (r'tpu v5 ?(lite|e\b)', 197e12, 'TPU v5e chip'),
    (r'tpu v5', 459e12, 'TPU v5p chip'),
    (r'tpu v6 ?(lite|e\b)', 918e12, 'TPU v6e chip'),
)


def table_peak_flops(device_kind: str) -> float | None:
  """The `PEAK_FLOPS` entry of a device kind ('NVIDIA H100 80GB HBM3'), None if none."""
  kind = device_kind.lower()
  return next((peak for pattern, peak, _ in PEAK_FLOPS if re.search(pattern, kind)), None)


def peak_flops_per_device(configured: float | None, device: Any) -> float | None:
  """`configured` (config.peak_flops_per_device) when set, else the table's for `device`
  (a jax Device; its `device_kind`), else None (e.g. CPU)."""
  if configured is not None:
    return float(configured)
  return table_peak_flops(getattr(device, 'device_kind', ''))


def compiled_flops(compiled: Any) -> float | None:
  """'flops' of a compiled program's `cost_analysis()` (per device); None when XLA
  gives none. Older JAX returns a list of one dict per module: their sum."""
  analysis = compiled.cost_analysis()
  if analysis is None:
    return None
  if isinstance(analysis, dict):
    analysis = [analysis]
  values = [a['flops'] for a in analysis if a and 'flops' in a]
  return float(sum(values)) if values else None


class StepAccounting:
  """The compute columns of a run's train rows (see the module docstring).

  flops: () -> flops_per_step or None, called once, on the first row: the
    program it analyses is the one the first step compiled (lowering it again
    finds it in JAX's cache; nothing is compiled twice).
  num_devices: devices of the mesh, all processes.
  peak_flops_per_device: FLOP/s, None: unknown (no `mfu`).
  images_per_step: the global batch (`images_per_sec`).
  """

  def __init__(self, flops: Callable[[], float | None], num_devices: int,
               peak_flops_per_device: float | None, images_per_step: int = 0):
    self._flops, self._value = flops, None
    self.num_devices, self.peak_flops_per_device = num_devices, peak_flops_per_device
    self.images_per_step = images_per_step

  @property
  def flops_per_step(self) -> float | None:
    if self._flops is not None:
      self._value, self._flops = self._flops(), None
    return self._value

  def scalars(self, seconds_per_step: float | None) -> dict[str, float]:
    """{'flops_per_step'[, 'device_seconds_per_step'[, 'mfu']]}: those known, the
    last two only for a timed interval (`seconds_per_step` not None)."""
    flops = self.flops_per_step
    out = {} if flops is None else {'flops_per_step': flops}
    if seconds_per_step is None:
      return out
    out['device_seconds_per_step'] = seconds_per_step * self.num_devices
    if flops is not None and self.peak_flops_per_device:
      out['mfu'] = flops / (seconds_per_step * self.peak_flops_per_device)
    return out
