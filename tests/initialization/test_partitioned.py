"""read_partitioned against a second writer written here from the format description.

The writer below packs the reference V-MoE code's partitioned format with the
msgpack package directly (ext 8 array records in the index, ext 1 arrays and ext
6 slices in the data shards); it shares nothing with the reader. Then hostile
files: each must be refused with a one-line PartitionedFormatError naming the
file, and nothing written.
"""
import os
import pickle
import time

import ml_dtypes
import msgpack
import numpy as np
import pytest

from vmoe_sparse_ot.initialization.partitioned import (
  PartitionedFormatError,
  is_partitioned,
  read_partitioned,
)

MARK = "__msgpack_array_chunk_a87ca2__"
KERNEL = "Encoder/encoderblock_1/Moe/Mlp/Dense_0/kernel"
BIAS = "Encoder/encoderblock_1/Moe/Mlp/Dense_0/bias"


# ------------------------------------------------------------- the second writer


def slice_nd_payload(bounds):
  """One bin per axis, each [start, stop, step=nil]."""
  return msgpack.packb([msgpack.packb([a, b, None]) for a, b in bounds])


def index_record(shape, dtype_name, chunks):
  """Ext 8: [bin [shape, dtype, weak_type, named_shape], [slice bins], [shards]]."""
  shaped = msgpack.packb([list(shape), dtype_name, False, {}])
  return msgpack.ExtType(8, msgpack.packb(
      [shaped, [slice_nd_payload(b) for b, _ in chunks], [s for _, s in chunks]]))


def array_ext(values):
  """Ext 1: [shape, dtype name, raw little-endian C-order bytes]."""
  return msgpack.ExtType(1, msgpack.packb([list(values.shape), values.dtype.name,
                                           values.tobytes()]))


def leaf_order(paths):
  """The writer numbers leaves depth-first with each level's keys sorted (tuple order)."""
  return sorted(paths, key=lambda p: tuple(p.split("/")))


def build(arrays, layout, shard_count, piece=None):
  """(index object, {shard: shard object}) for {path: array} and {path: [(bounds, shard)]}."""
  tree, shards = {}, {s: {MARK: True} for s in range(shard_count)}
  for number, path in enumerate(leaf_order(arrays)):
    arr, node = arrays[path], tree
    *parents, leaf = path.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = index_record(arr.shape, arr.dtype.name, layout[path])
    for bounds, s in layout[path]:
      flat = np.ascontiguousarray(arr[tuple(slice(a, b) for a, b in bounds)]).reshape(-1)
      step = piece or max(flat.size, 1)
      pieces = [flat[i:i + step] for i in range(0, flat.size, step)]
      shards[s].setdefault(str(number), []).append(
          [[array_ext(p) for p in pieces], msgpack.ExtType(6, slice_nd_payload(bounds))])
  return {"shard_count": shard_count, "index": tree, "version": "20220622"}, shards


def dump(prefix, index, shards, shard_count=None):
  shard_count = index["shard_count"] if shard_count is None else shard_count
  with open(f"{prefix}.index", "wb") as f:
    f.write(msgpack.packb(index))
  for s, obj in shards.items():
    with open(f"{prefix}.data-{s:05d}-of-{shard_count:05d}", "wb") as f:
      f.write(msgpack.packb(obj))


def sample():
  rng = np.random.default_rng(0)
  arrays = {
      KERNEL: rng.normal(size=(4, 3, 5)).astype(np.float32),   # 4 experts
      BIAS: rng.normal(size=(4, 5)).astype(np.float32),
      "Encoder/encoder_norm/scale": rng.normal(size=(6,)).astype(ml_dtypes.bfloat16),
      # Sorts before 'Encoder/...' as a string, after it as a path: same shape and
      # dtype, so a reader numbering leaves by string order would swap them silently.
      "Encoder-x": rng.normal(size=(6,)).astype(ml_dtypes.bfloat16),
      "head/kernel": rng.normal(size=(6, 10)).astype(np.float32),
      "step": np.array(1234, np.int32),
      "ids": np.arange(12, dtype=np.int32).reshape(3, 4),
  }

  def experts(shape, shards):   # one chunk per expert (axis 0), expert e on shards[e]
    return [(((e, e + 1),) + tuple((0, d) for d in shape[1:]), s) for e, s in enumerate(shards)]

  layout = {
      KERNEL: experts((4, 3, 5), (0, 1, 2, 0)),
      BIAS: experts((4, 5), (1, 2, 0, 1)),
      "Encoder/encoder_norm/scale": [(((0, 6),), 2)],
      "Encoder-x": [(((0, 6),), 2)],
      "head/kernel": [(((0, 6), (0, 4)), 0), (((0, 6), (4, 10)), 1)],   # along axis 1
      "step": [((), 0)],
      "ids": [(((0, 2), (0, 2)), 0), (((0, 2), (2, 4)), 1), (((2, 3), (0, 2)), 2),
              (((2, 3), (2, 4)), 2)],
  }
  return arrays, layout


@pytest.fixture
def ckpt(tmp_path):
  """(prefix, arrays, index, shards) of a written 3-shard checkpoint."""
  arrays, layout = sample()
  index, shards = build(arrays, layout, 3)
  prefix = str(tmp_path / "model.ckpt")
  dump(prefix, index, shards)
  return prefix, arrays, index, shards


def refused(prefix, *fragments, **kwargs):
  """read_partitioned refuses with one line holding every fragment; writes nothing."""
  folder = os.path.dirname(prefix)
  before = sorted(os.listdir(folder))
  with pytest.raises(PartitionedFormatError) as info:
    read_partitioned(prefix, **kwargs)
  message = str(info.value)
  assert "\n" not in message, message
  for fragment in fragments:
    assert fragment in message, message
  assert sorted(os.listdir(folder)) == before
  return message


# ------------------------------------------------------------- round trips


@pytest.mark.parametrize("piece,version", [(None, "20220622"), (4, "20220622"), (7, None)])
def test_round_trip(tmp_path, piece, version):
  arrays, layout = sample()
  index, shards = build(arrays, layout, 3, piece=piece)   # piece: subchunk length
  if version is None:
    del index["version"]   # checkpoints written before the version field
  prefix = str(tmp_path / "model.ckpt")
  dump(prefix, index, shards)
  assert is_partitioned(prefix) and not is_partitioned(prefix + "x")
  out = read_partitioned(prefix)
  assert list(out) == leaf_order(arrays)
  for name, arr in arrays.items():
    assert out[name].dtype == arr.dtype and out[name].shape == arr.shape, name
    assert np.array_equal(out[name], arr), name


def test_train_state_names_kept(tmp_path):
  arrays = {"optimizer/target/head/bias": np.arange(3, dtype=np.float32),
            "params/head/bias": np.ones(3, np.float64)}
  index, shards = build(arrays, {k: [(((0, 3),), 0)] for k in arrays}, 1)
  dump(str(tmp_path / "s"), index, shards)
  out = read_partitioned(str(tmp_path / "s"))
  assert sorted(out) == sorted(arrays) and out["params/head/bias"].dtype == np.float64


def test_remote_prefix_reads_as_the_local_one(ckpt):
  """The same files on a remote file system (tests/memory_fs.py): the same arrays; a
  shard missing there is the same one-line refusal."""
  from tests import memory_fs
  prefix = ckpt[0]
  memory_fs.reset()
  folder = os.path.dirname(prefix)
  for name in os.listdir(folder):
    memory_fs.put_file(f"memtest://ckpts/{name}", os.path.join(folder, name))
  remote = "memtest://ckpts/model.ckpt"
  assert is_partitioned(remote) and not is_partitioned(remote + "x")
  local, got = read_partitioned(prefix), read_partitioned(remote)
  assert list(got) == list(local)
  for name in local:
    assert got[name].dtype == local[name].dtype and np.array_equal(got[name], local[name])
  memory_fs.reset()
  for name in os.listdir(folder):
    if not name.endswith(".data-00001-of-00003"):
      memory_fs.put_file(f"memtest://ckpts/{name}", os.path.join(folder, name))
  with pytest.raises(PartitionedFormatError, match=r"^model.ckpt.data-00001-of-00003: missing"):
    read_partitioned(remote)
  memory_fs.reset()


# ------------------------------------------------------------- hostile indexes


def set_leaf(index, path, value):
  node = index["index"]
  *parents, leaf = path.split("/")
  for p in parents:
    node = node[p]
  node[leaf] = value


def test_unknown_ext_type_in_index(ckpt):
  prefix, _, index, shards = ckpt
  set_leaf(index, "step", msgpack.ExtType(42, b"\x00"))
  dump(prefix, index, shards)
  refused(prefix, "model.ckpt.index", "ext type 42")
  # Ext 1 (an inline array) is a known type, but not one an index may hold.
  set_leaf(index, "step", array_ext(np.zeros(2, np.float32)))
  dump(prefix, index, shards)
  refused(prefix, "model.ckpt.index", "ext type 1")


class _Evil:
  """Unpickling this would create a file."""

  def __init__(self, path):
    self.path = path

  def __reduce__(self):
    return (open, (self.path, "w"))


def test_pickle_is_never_loaded(ckpt, tmp_path):
  prefix, arrays, index, shards = ckpt
  sentinel = tmp_path / "pwned"
  payload = pickle.dumps(_Evil(str(sentinel)))
  with open(prefix + ".index", "wb") as f:   # a whole pickled index
    f.write(payload)
  refused(prefix, "model.ckpt.index")
  good = msgpack.packb(index)
  set_leaf(index, "step", msgpack.ExtType(8, payload))   # a pickle inside an array record
  dump(prefix, index, shards)
  refused(prefix, "model.ckpt.index", "step")
  step = str(leaf_order(arrays).index("step"))
  shards[0][step][0][0][0] = msgpack.ExtType(1, payload)   # ... and inside a data shard
  dump(prefix, msgpack.unpackb(good, ext_hook=msgpack.ExtType), shards)
  refused(prefix, "model.ckpt.data-00000-of-00003", "step")
  assert not sentinel.exists()


@pytest.mark.parametrize("shard", [3, -1, "../../etc/passwd", "/etc/passwd", True, 1.0])
def test_shard_number_out_of_range(ckpt, shard):
  # Shard files are named from the prefix and an int only: no name in the
  # format can reach another folder, and out-of-range numbers are refused.
  prefix, _, index, shards = ckpt
  set_leaf(index, "step", index_record((), "int32", [((), shard)]))
  dump(prefix, index, shards)
  refused(prefix, "model.ckpt.index", "step", "shard number")


@pytest.mark.parametrize("count", ["../x", "/abs", 0, 10**6, True, None])
def test_bad_shard_count(ckpt, count):
  prefix, _, index, shards = ckpt
  index["shard_count"] = count
  dump(prefix, index, shards, shard_count=3)
  refused(prefix, "model.ckpt.index", "shard_count")


def test_huge_shape_fails_fast_without_allocating(tmp_path):
  prefix = str(tmp_path / "huge")
  shape = (2**30, 2**30, 2**10)   # 4 EiB of float32
  index = {"shard_count": 1, "version": "20220622",
           "index": {"big": {"kernel": index_record(shape, "float32",
                                                    [(tuple((0, d) for d in shape), 0)])}}}
  dump(prefix, index, {0: {MARK: True}})
  start = time.perf_counter()
  refused(prefix, "huge.index", "big/kernel", "max_bytes")
  # Within max_bytes, but more than the shard file can hold (4 GiB declared).
  shape = (2**20, 2**10)
  index["index"]["big"]["kernel"] = index_record(shape, "float32",
                                                 [(tuple((0, d) for d in shape), 0)])
  dump(prefix, index, {0: {MARK: True}})
  refused(prefix, "huge.data-00000-of-00001", "truncated", "big/kernel")
  assert time.perf_counter() - start < 1.0


def test_max_bytes(ckpt):
  prefix = ckpt[0]
  refused(prefix, "model.ckpt.index", "max_bytes=100", max_bytes=100)


@pytest.mark.parametrize("chunks,fragment", [
    ([((0, 2),), ((3, 4),)], "gaps"),
    ([((0, 3),), ((2, 4),)], "overlap"),
    ([((0, 2),), ((0, 2),), ((2, 4),)], "twice"),
    ([((0, 5),)], "outside"),
    ([((2, 1),), ((0, 4),)], "outside"),
])
def test_chunk_coverage(tmp_path, chunks, fragment):
  prefix = str(tmp_path / "c")
  record = index_record((4,), "float32", [(b, 0) for b in chunks])
  index = {"shard_count": 1, "index": {"w": record}}
  dump(prefix, index, {0: {MARK: True}})
  refused(prefix, "c.index", "w:", fragment)


def test_overlap_and_gap_with_the_right_total(tmp_path):
  # 2 + 2 elements of a 2 x 2 array, but (0, 0) twice and (1, 1) never.
  prefix = str(tmp_path / "c")
  chunks = [(((0, 1), (0, 2)), 0), (((0, 2), (0, 1)), 0)]
  dump(prefix, {"shard_count": 1, "index": {"w": index_record((2, 2), "float32", chunks)}},
       {0: {MARK: True}})
  refused(prefix, "c.index", "w:", "overlap and leave gaps")


def test_object_dtype(tmp_path):
  prefix = str(tmp_path / "o")
  dump(prefix, {"shard_count": 1, "index": {"w": index_record((1,), "object", [(((0, 1),), 0)])}},
       {0: {MARK: True}})
  refused(prefix, "o.index", "w:", "dtype 'object'")


# ------------------------------------------------------------- hostile shards


def test_truncated_shard(ckpt):
  prefix = ckpt[0]
  path = prefix + ".data-00001-of-00003"
  with open(path, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:   # shorter than the array data the index puts there
    f.write(data[:12])
  refused(prefix, "model.ckpt.data-00001-of-00003: truncated (12 bytes", f"from {BIAS} on")
  with open(path, "wb") as f:   # one byte short: found while streaming
    f.write(data[:-1])
  refused(prefix, "model.ckpt.data-00001-of-00003: truncated")


def test_missing_shard(ckpt):
  prefix = ckpt[0]
  os.remove(prefix + ".data-00002-of-00003")
  refused(prefix, "model.ckpt.data-00002-of-00003: missing")


def test_shard_chunk_must_match_index(ckpt):
  prefix, arrays, index, shards = ckpt
  number = str(leaf_order(arrays).index(KERNEL))
  chunk = shards[0][number][0]   # expert 0 of the kernel

  chunk[0] = [array_ext(np.zeros(15, np.float64))]
  dump(prefix, index, shards)
  refused(prefix, "data-00000-of-00003", KERNEL, "float64")

  chunk[0] = [array_ext(np.zeros(14, np.float32))]
  dump(prefix, index, shards)
  refused(prefix, "data-00000-of-00003", KERNEL, "holds 14 values")

  chunk[0] = [array_ext(np.zeros(15, np.float32))]
  chunk[1] = msgpack.ExtType(6, slice_nd_payload(((1, 2), (0, 3), (0, 5))))   # expert 1's slot
  dump(prefix, index, shards)
  refused(prefix, "data-00000-of-00003", KERNEL, "not one the index places here")

  chunk[1] = msgpack.ExtType(6, slice_nd_payload(((0, 1), (0, 3), (0, 5))))
  chunk[0] = [msgpack.ExtType(3, b"\x00")]
  dump(prefix, index, shards)
  refused(prefix, "data-00000-of-00003", KERNEL, "ext type 3")


def test_shard_extra_and_missing_content(ckpt):
  prefix, arrays, index, shards = ckpt
  path = prefix + ".data-00002-of-00003"
  dump(prefix, index, shards)
  with open(path, "ab") as f:
    f.write(b"\x00" * 3)
  refused(prefix, "data-00002-of-00003", "3 bytes after the data")

  del shards[2][MARK]
  dump(prefix, index, shards)
  refused(prefix, "data-00002-of-00003", "marker")

  shards[2][MARK] = True
  del shards[2][str(leaf_order(arrays).index("Encoder-x"))]
  dump(prefix, index, shards)
  refused(prefix, "data-00002-of-00003", "lacks chunk [0:6] of Encoder-x")
