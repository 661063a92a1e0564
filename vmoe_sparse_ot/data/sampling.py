"""Index arithmetic of the input streams: which record each process reads at each position.

The training stream is an endless sequence of positions i = 0, 1, 2, ...; position
i is record `permute(i % N, N, seed, epoch=i // N)` of the split (N records), so
each epoch visits every record once, in an order fixed by (seed, epoch). Global
batch t is positions [t*G, (t+1)*G) with G = P*b, and process p of P reads rows
[p*b, (p+1)*b) of it: local position j of process p is global position
`global_positions(j)`. Everything is computed from the position, nothing is
replayed, so a restart at step t costs the same for any t.

`permute` is a keyed bijection of [0, N) (a Feistel network on the next
power-of-4 domain with cycle walking, the construction behind Grain's and
TensorFlow's `index_shuffle`): O(1) memory and work per index, no per-epoch
permutation array (13M ImageNet-21k records would take ~3 s and 100 MB to
permute with numpy on this project's CPUs, per epoch and process).
"""
from __future__ import annotations

import numpy as np

_ROUNDS = 6
_GOLDEN = 0x9E3779B97F4A7C15


def global_positions(local: np.ndarray, batch_size: int, process_index: int,
                     process_count: int) -> np.ndarray:
  """Global stream positions of process p's local positions j (int64, same shape).

  Local position j lies in the process's batch j // b, row j % b; that batch is
  global batch j // b, where the process holds rows [p*b, (p+1)*b).
  """
  local = np.asarray(local, np.int64)
  b = batch_size
  return (local // b) * (b * process_count) + process_index * b + local % b


def _mix(x: np.ndarray) -> np.ndarray:
  # splitmix64's finalizer: a bijective avalanche of a uint64 (wraps, no overflow warning
  # on arrays).
  x = x ^ (x >> np.uint64(30))
  x = x * np.uint64(0xBF58476D1CE4E5B9)
  x = x ^ (x >> np.uint64(27))
  x = x * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


def _round_keys(seed: int, epoch: np.ndarray) -> np.ndarray:
  """(_ROUNDS, n) uint64 keys, one set per (seed, epoch)."""
  base = _mix(np.full(epoch.shape, np.int64(seed).view(np.uint64)) + np.uint64(_GOLDEN))
  base = _mix(base ^ epoch.astype(np.uint64))
  return np.stack([_mix(base + np.uint64((r + 1) * _GOLDEN % 2**64)) for r in range(_ROUNDS)])


def _feistel(x: np.ndarray, keys: np.ndarray, half_bits: int) -> np.ndarray:
  """A keyed bijection of [0, 4**half_bits) (uint64 in, uint64 out)."""
  h = np.uint64(half_bits)
  mask = np.uint64((1 << half_bits) - 1)
  left, right = x >> h, x & mask
  for key in keys:
    left, right = right, left ^ (_mix(right ^ key) & mask)
  return (left << h) | right


def permute(index: np.ndarray, num_records: int, seed: int, epoch: np.ndarray | int = 0
            ) -> np.ndarray:
  """Position `index` (in [0, N)) of epoch `epoch`'s order -> record number (int64).

  For fixed (N, seed, epoch) a bijection of [0, N); different epochs (or seeds)
  give unrelated orders. `epoch` broadcasts against `index`.
  """
  if num_records <= 0:
    raise ValueError(f'num_records={num_records} must be positive')
  index = np.asarray(index, np.int64)
  if index.size and (index.min() < 0 or index.max() >= num_records):
    raise ValueError(f'index must be in [0, num_records={num_records})')
  epoch = np.broadcast_to(np.asarray(epoch, np.int64), index.shape).ravel()
  half_bits = max(1, ((num_records - 1).bit_length() + 1) // 2)
  keys = _round_keys(seed, epoch)
  out = _feistel(index.ravel().astype(np.uint64), keys, half_bits)
  # Cycle walking: re-encrypt values outside [0, N) until they land inside. The domain
  # is < 4N, so this takes under 4 passes on average, and stays a bijection of [0, N).
  outside = out >= np.uint64(num_records)
  while outside.any():
    out[outside] = _feistel(out[outside], keys[:, outside], half_bits)
    outside = out >= np.uint64(num_records)
  return out.astype(np.int64).reshape(index.shape)


def record_indices(positions: np.ndarray, num_records: int, seed: int) -> np.ndarray:
  """Training stream positions -> record numbers: epoch i // N in its seeded order."""
  positions = np.asarray(positions, np.int64)
  return permute(positions % num_records, num_records, seed, positions // num_records)
