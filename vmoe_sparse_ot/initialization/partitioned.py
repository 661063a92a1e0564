"""A safe reader for the reference V-MoE code's partitioned checkpoint format.

A checkpoint is a prefix P and the files `P.index` and `P.data-SSSSS-of-NNNNN`
(S the shard number, N the shard count, both zero-padded to 5 digits). Every
file is one msgpack object; numpy arrays and the slice and index records are
msgpack *ext* values whose payload is itself msgpack:

* `P.index` is a map `{'shard_count': N, 'index': TREE, 'version': '20220622'}`
  ('version' is absent in checkpoints written before that date). TREE is the
  saved tree as nested maps (lists saved as maps keyed '0', '1', ...); each leaf
  is an ext of type 8, an array description, whose payload is
  `[shaped, [slice_nd, ...], [shard, ...]]`:
    - `shaped`: bin holding `[shape, dtype name, weak_type, named_shape map]`;
    - one `slice_nd` per chunk of the array: bin holding one bin per axis,
      each `[start, stop, step]` (ints, step nil), the chunk's global slice;
    - `shard`: for each chunk, the number of the data shard that stores it.
* `P.data-SSSSS-of-NNNNN` is a map `{'__msgpack_array_chunk_a87ca2__': true,
  'i': [[subchunks, slice_nd], ...], ...}`: i is the array's position among the
  TREE leaves in depth-first order with the keys of every map sorted (how JAX
  flattens nested dicts); `slice_nd` is an ext of type 6 with the payload
  above; `subchunks` is a list of exts of type 1 (numpy arrays, payload
  `[shape, dtype name, raw C-order little-endian bytes]`) that, concatenated,
  are the chunk flattened in C order (the writer cuts chunks into pieces of at
  most 1 GiB).

Unversioned indexes numbered leaves in the saved Python tree's own flattening
order; for trees of nested dicts (parameter trees, as in the released
checkpoints) that is the same sorted order, and for other trees a misnumbered
chunk is refused by the shape, dtype and slice checks unless two arrays share
all three.

The chunks of an array tile its global shape: an expert kernel of shape (E, D, H)
saved over E devices is E chunks of shape (1, D, H), one slice per expert. The
reader puts them back together and returns full arrays keyed by the '/'-joined
tree path, exactly as stored (a train state keeps its 'params/...' or
'optimizer/target/...' prefixes; mapping names is the caller's job).

The prefix may be remote (`gs://...`): every file is opened through
`vmoe_sparse_ot.filesystem`, local paths with `os` and `open` as before.

The files are untrusted: nothing is unpickled or evaluated, only the ext types
above are accepted, shard files are named from the prefix and validated shard
numbers only, and the index is checked (dtypes, slices inside the shape, chunks
that tile each array exactly, total size within `max_bytes` and within what
each shard file's size can hold) before any array is allocated. Shards are then
read one at a time as a stream, every chunk checked against the index, and the
arrays are assembled only after every shard has been read and checked. Peak
memory is about the array data once plus the largest array.
"""
import dataclasses
import math
import os
import re
import sys
from typing import Any

import msgpack
import numpy as np

from vmoe_sparse_ot import filesystem
from vmoe_sparse_ot.values import is_int

try:
  import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes comes with jax
  ml_dtypes = None

DEFAULT_MAX_BYTES = 64 * 2**30
# An index holds a few hundred bytes per array; a huge one is not an index.
MAX_INDEX_BYTES = 256 * 2**20
# Shard numbers are written with 5 digits.
MAX_SHARD_COUNT = 99_999
# Chunk-tiling check: the cells of the grid drawn by all chunk boundaries of one
# array are counted in a uint8 array of at most this many entries.
MAX_TILING_CELLS = 2**24
VERSIONS = (None, "20220622")

_CHUNKS_KEY = "__msgpack_array_chunk_a87ca2__"
_EXT_NDARRAY = 1
_EXT_SLICE_ND = 6
_EXT_INDEX_INFO = 8
_MAX_DIM = 2**62   # keeps every start/stop inside int64
_MAX_DEPTH = 64    # nesting of the saved tree
_NDARRAY_HEADER_BYTES = 4096   # [shape, dtype name] of one subchunk fit in this

_DTYPE_NAMES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                "uint64", "float16", "float32", "float64", "complex64", "complex128")
DTYPES: dict[str, np.dtype] = {name: np.dtype(name) for name in _DTYPE_NAMES}
if ml_dtypes is not None:
  DTYPES["bfloat16"] = np.dtype(ml_dtypes.bfloat16)

Slices = tuple[tuple[int, int], ...]   # one chunk's global (start, stop) per axis


class PartitionedFormatError(ValueError):
  """A partitioned checkpoint refused; the message is one line naming the file."""


class _Refused(Exception):
  """A reason to refuse found deep in the parsing; the caller adds the file name."""


class _RefusedExt(_Refused):
  """Refused inside msgpack's ext hook, which does not know the array: the caller adds it."""


@dataclasses.dataclass(frozen=True)
class _Ext:
  """An accepted msgpack ext value, its payload decoded later (where its key is known)."""
  code: int
  data: bytes


@dataclasses.dataclass(frozen=True)
class _Subchunk:
  """One type-1 ext of a data shard: a flat piece of a chunk, viewing the ext payload."""
  dtype_name: str
  values: np.ndarray   # (n,), a view of the payload bytes


@dataclasses.dataclass(frozen=True)
class _Array:
  """One array of the index: where its chunks are and what they must hold."""
  name: str
  shape: tuple[int, ...]
  dtype: np.dtype
  slices: tuple[Slices, ...]   # one per chunk
  shards: tuple[int, ...]      # the shard of each chunk
  nbytes: int


def is_partitioned(path: str) -> bool:
  """True when `path` is the prefix of a partitioned checkpoint (`path + '.index'` exists).

  `path` may be remote (`gs://...`): the files are read through `vmoe_sparse_ot.filesystem`.
  """
  return filesystem.isfile(path + ".index")


def _shard_path(prefix: str, shard: int, shard_count: int) -> str:
  """The file of data shard `shard` of `shard_count`: only ever built from ints."""
  return f"{prefix}.data-{shard:05d}-of-{shard_count:05d}"


def read_partitioned(prefix: str, *, max_bytes: int | None = None) -> dict[str, np.ndarray]:
  """Reads a partitioned checkpoint into full arrays keyed by '/'-joined tree path.

  Args:
    prefix: the checkpoint's prefix P (files P.index and P.data-*).
    max_bytes: refuse checkpoints whose arrays total more bytes than this
      (default DEFAULT_MAX_BYTES, 64 GiB).

  Returns:
    {path: array} in the index's leaf order, each array of its global shape and
    stored dtype (bfloat16 as ml_dtypes.bfloat16, scalars as shape ()).

  Raises:
    PartitionedFormatError: a one-line reason naming the file (and the array),
      for anything that is not a well-formed checkpoint of this format.
  """
  if max_bytes is None:
    max_bytes = DEFAULT_MAX_BYTES
  if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes < 0:
    raise ValueError(f"max_bytes must be a non-negative int, got {max_bytes!r}")
  if sys.byteorder != "little":   # the payloads are little-endian and read as native
    raise PartitionedFormatError(f"{_base(prefix)}: needs a little-endian host")
  shard_count, arrays = _read_index(prefix + ".index", max_bytes)

  # What each shard must hold: {shard: {(array number, slices): None}} and its bytes.
  wanted: dict[int, dict[tuple[int, Slices], None]] = {}
  shard_bytes: dict[int, int] = {}
  first_key: dict[int, str] = {}   # shard -> the first array that does not fit in its file
  sizes: dict[int, int] = {}
  for number, array in enumerate(arrays):
    for sl, shard in zip(array.slices, array.shards):
      wanted.setdefault(shard, {})[(number, sl)] = None
      shard_bytes[shard] = shard_bytes.get(shard, 0) + _volume(sl) * array.dtype.itemsize
      path = _shard_path(prefix, shard, shard_count)
      if shard not in sizes:
        sizes[shard] = _regular_file_size(path, f"(the index places {array.name} in it)")
      if shard_bytes[shard] > sizes[shard] and shard not in first_key:
        first_key[shard] = array.name
  if first_key:
    # Each chunk costs its raw bytes plus headers: a shorter file cannot hold it.
    shard = min(first_key)
    raise PartitionedFormatError(
        f"{_base(_shard_path(prefix, shard, shard_count))}: truncated ({sizes[shard]} bytes, "
        f"less than the {shard_bytes[shard]} bytes of array data the index puts in it, "
        f"from {first_key[shard]} on)")

  got: dict[tuple[int, Slices], list[np.ndarray]] = {}
  for shard in sorted(wanted):
    _read_shard(_shard_path(prefix, shard, shard_count), sizes[shard], shard_bytes[shard],
                arrays, wanted[shard], got)

  # Every chunk has been read and checked: only now allocate the full arrays.
  out: dict[str, np.ndarray] = {}
  for number, array in enumerate(arrays):
    full = np.empty(array.shape, array.dtype)
    for sl in array.slices:
      parts = got.pop((number, sl))   # drop the chunk once copied: peak memory ~ data once
      if len(parts) == 1:
        flat = parts[0]
      else:
        flat = np.concatenate(parts) if parts else np.empty(0, array.dtype)
      full[tuple(slice(a, b) for a, b in sl)] = flat.reshape(tuple(b - a for a, b in sl))
    out[array.name] = full
  return out


# ---------------------------------------------------------------- the index


def _read_index(path: str, max_bytes: int) -> tuple[int, list[_Array]]:
  """Parses and checks P.index: (shard count, arrays in leaf order)."""
  name = _base(path)
  size = _regular_file_size(path, "(no index)")
  if size > MAX_INDEX_BYTES:
    raise PartitionedFormatError(f"{name}: {size} bytes, more than an index ({MAX_INDEX_BYTES})")
  try:
    with filesystem.open_binary(path) as f:
      data = f.read(MAX_INDEX_BYTES + 1)
  except OSError as e:
    raise PartitionedFormatError(f"{name}: unreadable ({_short(e)})") from None
  try:
    top = _unpack(data, _index_ext_hook)
    if not isinstance(top, dict):
      raise _Refused(f"not an index (a msgpack {type(top).__name__}, not a map)")
    keys = set(top)
    if not keys <= {"shard_count", "index", "version"} or not {"shard_count", "index"} <= keys:
      raise _Refused(f"not an index (keys {_short(sorted(map(str, top)))})")
    version = top.get("version")
    if version not in VERSIONS:
      raise _Refused(f"unknown version {_short(version)}")
    shard_count = top["shard_count"]
    if not is_int(shard_count) or not 1 <= shard_count <= MAX_SHARD_COUNT:
      raise _Refused(f"shard_count {_short(shard_count)} is not an int in [1, {MAX_SHARD_COUNT}]")
    leaves: list[tuple[str, bytes]] = []
    if not isinstance(top["index"], dict):
      raise _Refused("the saved tree is not a map")
    _flatten(top["index"], [], leaves)
    arrays, total = [], 0
    for key, payload in leaves:
      array = _parse_index_info(key, payload, shard_count, max_bytes)
      total += array.nbytes
      if total > max_bytes:
        raise _Refused(f"arrays up to {key} total {total} bytes, over max_bytes={max_bytes}")
      arrays.append(array)
  except _Refused as e:
    raise PartitionedFormatError(f"{name}: {e}") from None
  return shard_count, arrays


def _index_ext_hook(code: int, data: bytes) -> _Ext:
  if code != _EXT_INDEX_INFO:
    raise _Refused(f"msgpack ext type {code} is not accepted in an index")
  return _Ext(code, data)


def _flatten(node: dict[Any, Any], path: list[str], out: list[tuple[str, bytes]]) -> None:
  """Leaves in the writer's numbering: depth-first, each map's keys sorted (JAX's order)."""
  if len(path) >= _MAX_DEPTH:
    raise _Refused(f"the saved tree nests deeper than {_MAX_DEPTH} at {'/'.join(path)}")
  for key in node:
    # Keys become '/'-joined names and error messages: one line, no ambiguity.
    if not isinstance(key, str) or not key or "/" in key or not key.isprintable():
      raise _Refused(f"tree key {_short(key)} under '{'/'.join(path)}' is not a plain name")
  for key in sorted(node):
    value, where = node[key], path + [key]
    if isinstance(value, dict):
      _flatten(value, where, out)
    elif isinstance(value, _Ext):
      out.append(("/".join(where), value.data))
    elif value is not None:   # None is an empty subtree to JAX: no array, no number
      raise _Refused(f"{'/'.join(where)}: leaf is a {type(value).__name__}, not an array record")


def _parse_index_info(key: str, payload: bytes, shard_count: int, max_bytes: int) -> _Array:
  """One type-8 ext: checks shape, dtype, size, slices, shards and the tiling."""
  try:
    fields = _unpack(payload)
    if not (isinstance(fields, list) and len(fields) == 3 and isinstance(fields[0], bytes)
            and isinstance(fields[1], list) and isinstance(fields[2], list)):
      raise _Refused("array record is not [shaped, slices, shards]")
    shaped = _unpack(fields[0])
    if not (isinstance(shaped, list) and len(shaped) == 4 and isinstance(shaped[3], dict)):
      raise _Refused("shape record is not [shape, dtype, weak_type, named_shape]")
    shape = _shape(shaped[0])
    dtype = _dtype(shaped[1])
    nbytes = math.prod(shape) * dtype.itemsize
    # Before anything proportional to the shape: a hostile shape must cost nothing.
    if nbytes > max_bytes:
      raise _Refused(f"shape {shape} {dtype.name} is {nbytes} bytes, over max_bytes={max_bytes}")
    slices = tuple(_slice_nd(b, shape) for b in fields[1])
    shards = tuple(fields[2])
    if len(shards) != len(slices):
      raise _Refused(f"{len(slices)} chunk slices but {len(shards)} shard numbers")
    for shard in shards:
      if not is_int(shard) or not 0 <= shard < shard_count:
        raise _Refused(f"shard number {_short(shard)} is not an int in [0, {shard_count})")
    _check_tiling(shape, slices)
  except _Refused as e:
    raise _Refused(f"{key}: {e}") from None
  return _Array(key, shape, dtype, slices, shards, nbytes)


def _shape(value: Any) -> tuple[int, ...]:
  if not isinstance(value, list) or len(value) > 32:
    raise _Refused(f"shape {_short(value)} is not a list of at most 32 ints")
  if not all(is_int(d) and 0 <= d <= _MAX_DIM for d in value):
    raise _Refused(f"shape {_short(value)} has a dimension that is not an int in [0, 2**62]")
  return tuple(value)


def _dtype(value: Any) -> np.dtype:
  if isinstance(value, bytes):
    value = value.decode("ascii", "replace")
  if not isinstance(value, str) or value not in DTYPES:
    raise _Refused(f"dtype {_short(value)} is not a supported numeric dtype")
  return DTYPES[value]


def _slice_nd(data: Any, shape: tuple[int, ...]) -> Slices:
  """A slice_nd payload: one [start, stop, step] bin per axis, inside `shape`."""
  if not isinstance(data, bytes):
    raise _Refused(f"chunk slice {_short(data)} is not a msgpack bin")
  axes = _unpack(data)
  if not isinstance(axes, list) or len(axes) != len(shape):
    raise _Refused(f"chunk slice {_short(axes)} does not have one entry per axis of {shape}")
  out = []
  for axis_data, dim in zip(axes, shape):
    triple = _unpack(axis_data) if isinstance(axis_data, bytes) else None
    if not isinstance(triple, list) or len(triple) != 3:
      raise _Refused(f"chunk slice axis {_short(triple)} is not [start, stop, step]")
    start, stop, step = triple
    start = 0 if start is None else start
    stop = dim if stop is None else stop
    if not (is_int(start) and is_int(stop) and step in (None, 1) and 0 <= start <= stop <= dim):
      raise _Refused(f"chunk slice {_short(triple)} is outside shape {shape}")
    out.append((start, stop))
  return tuple(out)


def _check_tiling(shape: tuple[int, ...], slices: tuple[Slices, ...]) -> None:
  """The chunks cover every element of `shape` exactly once.

  All chunk boundaries on each axis cut the array into a grid of cells; each
  chunk is a block of cells. Counting, per cell, the chunks that hold it finds
  gaps (0) and overlaps (> 1) in time and memory of the grid's size, never the
  array's. The grid is small for the writer's layouts (a device mesh: one cell
  per chunk).
  """
  if len(set(slices)) != len(slices):
    raise _Refused("a chunk slice is listed twice")
  size = math.prod(shape)
  covered = sum(_volume(sl) for sl in slices)
  if covered != size:
    kind = "leave gaps" if covered < size else "overlap"
    raise _Refused(f"chunks {kind} ({covered} elements for shape {shape}, {size} elements)")
  if size == 0:
    return
  cuts = [sorted({0, dim, *(sl[a][0] for sl in slices), *(sl[a][1] for sl in slices)})
          for a, dim in enumerate(shape)]
  cells = math.prod(len(c) - 1 for c in cuts)
  if cells > MAX_TILING_CELLS:
    raise _Refused(f"chunk layout too irregular to check ({cells} grid cells)")
  where = [{x: i for i, x in enumerate(c)} for c in cuts]   # cut value -> grid line
  blocks = [tuple(slice(w[a], w[b]) for (a, b), w in zip(sl, where)) for sl in slices]
  if sum(math.prod(s.stop - s.start for s in block) for block in blocks) != cells:
    raise _Refused(f"chunks overlap and leave gaps in shape {shape}")
  count = np.zeros([len(c) - 1 for c in cuts], np.uint8)
  for block in blocks:
    count[block] += 1   # wraps at 256, but the cell total above forces all 1 if all == 1 mod 256
  if not np.all(count == 1):
    raise _Refused(f"chunks overlap and leave gaps in shape {shape}")


# ---------------------------------------------------------------- the data shards


def _read_shard(path: str, size: int, expected_bytes: int, arrays: list[_Array],
                wanted: dict[tuple[int, Slices], None],
                got: dict[tuple[int, Slices], list[np.ndarray]]) -> None:
  """Streams one data shard, checking each chunk against the index, into `got`."""
  name = _base(path)
  where = "its header"
  limit = min(2**32 - 1, max(size, 1))
  try:
    with filesystem.open_binary(path) as f:
      unpacker = msgpack.Unpacker(
          f, raw=False, strict_map_key=True, ext_hook=_shard_ext_hook,
          read_size=min(2**20, limit), max_buffer_size=limit,
          # No ext may be larger than the data the index puts in this shard.
          max_ext_len=min(limit, expected_bytes + _NDARRAY_HEADER_BYTES),
          max_str_len=256, max_bin_len=256, max_array_len=1024, max_map_len=1024)
      entries = unpacker.read_map_header()
      if entries > len(arrays) + 1:
        raise _Refused(f"map of {entries} entries, more than the index's {len(arrays)} arrays")
      marked, seen_numbers, read_bytes = False, set(), 0
      for _ in range(entries):
        key = unpacker.unpack()
        if key == _CHUNKS_KEY:
          if unpacker.unpack() is not True or marked:
            raise _Refused(f"bad {_CHUNKS_KEY} entry")
          marked = True
          continue
        if not isinstance(key, str) or not re.fullmatch(r"[0-9]{1,9}", key, re.ASCII):
          raise _Refused(f"key {_short(key)} is not an array number")
        number = int(key)
        if number >= len(arrays) or number in seen_numbers:
          raise _Refused(f"array number {number} is not in the index or comes twice")
        seen_numbers.add(number)
        array = arrays[number]
        where = f"a chunk of {array.name}"
        n_chunks = unpacker.read_array_header()
        if n_chunks > len(array.slices):
          raise _Refused(f"{n_chunks} chunks of {array.name}, the index has {len(array.slices)}")
        for _ in range(n_chunks):
          if unpacker.read_array_header() != 2:
            raise _Refused(f"a chunk of {array.name} is not [subchunks, slice]")
          parts, n_values = [], 0
          for _ in range(unpacker.read_array_header()):
            part = unpacker.unpack()
            if not isinstance(part, _Subchunk):
              raise _Refused(f"a chunk of {array.name} holds a {type(part).__name__}, "
                             "not an array")
            if part.dtype_name != array.dtype.name:
              raise _Refused(f"a chunk of {array.name} is {part.dtype_name}, "
                             f"the index says {array.dtype.name}")
            read_bytes += part.values.nbytes
            if read_bytes > expected_bytes:
              raise _Refused(f"more array data than the {expected_bytes} bytes the index "
                             f"puts here (at {array.name})")
            parts.append(part.values)
            n_values += part.values.size
          ext = unpacker.unpack()
          if not isinstance(ext, _Ext) or ext.code != _EXT_SLICE_ND:
            raise _Refused(f"a chunk of {array.name} has no slice")
          try:
            sl = _slice_nd(ext.data, array.shape)
          except _Refused as e:
            raise _Refused(f"{array.name}: {e}") from None
          if (number, sl) not in wanted or (number, sl) in got:
            raise _Refused(f"chunk {_fmt(sl)} of {array.name} is not one the index places "
                           "here, or comes twice")
          if n_values != _volume(sl):
            raise _Refused(f"chunk {_fmt(sl)} of {array.name} holds {n_values} values, "
                           f"its slice {_volume(sl)}")
          got[(number, sl)] = parts
        where = "its header"
      if not marked:
        raise _Refused(f"no {_CHUNKS_KEY} marker: not a data shard")
      if unpacker.tell() != size:
        raise _Refused(f"{size - unpacker.tell()} bytes after the data")
    for number, sl in wanted:
      if (number, sl) not in got:
        raise _Refused(f"lacks chunk {_fmt(sl)} of {arrays[number].name} that the index "
                       "places here")
  except msgpack.OutOfData:
    raise PartitionedFormatError(f"{name}: truncated (ends inside {where})") from None
  except _RefusedExt as e:
    raise PartitionedFormatError(f"{name}: {e} (in {where})") from None
  except _Refused as e:
    raise PartitionedFormatError(f"{name}: {e}") from None
  except OSError as e:
    raise PartitionedFormatError(f"{name}: unreadable ({_short(e)})") from None
  except (ValueError, TypeError, msgpack.UnpackException) as e:
    raise PartitionedFormatError(f"{name}: not a data shard (in {where}: {_short(e)})") from None


def _shard_ext_hook(code: int, data: bytes) -> Any:
  """Ext values of a data shard: numpy arrays (decoded here) and slices (decoded later)."""
  if code == _EXT_SLICE_ND:
    return _Ext(code, data)
  if code != _EXT_NDARRAY:
    raise _RefusedExt(f"msgpack ext type {code} is not accepted in a data shard")
  # Payload [shape, dtype name, bin]: parse the small header with msgpack, then
  # take the bin by hand so that its bytes are viewed, not copied.
  head = msgpack.Unpacker(raw=False, strict_map_key=True, ext_hook=_no_ext,
                          max_buffer_size=_NDARRAY_HEADER_BYTES)
  head.feed(memoryview(data)[:_NDARRAY_HEADER_BYTES])
  try:
    if head.read_array_header() != 3:
      raise _RefusedExt("array payload is not [shape, dtype, bytes]")
    shape = _shape(head.unpack())
    dtype = _dtype(head.unpack())
  except msgpack.OutOfData:
    raise _RefusedExt("array payload header is cut or too long") from None
  except _RefusedExt:
    raise
  except _Refused as e:
    raise _RefusedExt(str(e)) from None
  except (ValueError, TypeError, msgpack.UnpackException) as e:
    raise _RefusedExt(f"array payload is not valid msgpack ({_short(e)})") from None
  pos = head.tell()
  tag = data[pos] if pos < len(data) else None
  widths = {0xC4: 1, 0xC5: 2, 0xC6: 4}   # msgpack bin 8 / 16 / 32: length bytes
  if tag not in widths or pos + 1 + widths[tag] > len(data):
    raise _RefusedExt("array payload bytes are not a msgpack bin")
  start = pos + 1 + widths[tag]
  length = int.from_bytes(data[pos + 1:start], "big")
  if start + length != len(data) or length != math.prod(shape) * dtype.itemsize:
    raise _RefusedExt(f"array payload holds {len(data) - start} bytes, its shape {shape} "
                      f"{dtype.name} needs {math.prod(shape) * dtype.itemsize}")
  values = np.frombuffer(memoryview(data)[start:], dtype=np.uint8)
  return _Subchunk(dtype.name, values.view(dtype))


# ---------------------------------------------------------------- helpers


def _unpack(data: bytes, ext_hook=None) -> Any:
  """msgpack bytes -> Python values; exts refused unless `ext_hook` takes them."""
  try:
    return msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=ext_hook or _no_ext)
  except _Refused:
    raise
  except (ValueError, TypeError, msgpack.UnpackException) as e:
    raise _Refused(f"not valid msgpack ({_short(e)})") from None


def _no_ext(code: int, data: bytes) -> Any:
  raise _Refused(f"msgpack ext type {code} is not accepted here")


def _regular_file_size(path: str, why_needed: str) -> int:
  # A FIFO or device would block or never end; only plain files are read.
  try:
    st = filesystem.stat(path)
  except OSError:
    raise PartitionedFormatError(f"{_base(path)}: missing {why_needed}") from None
  if not st.is_regular:
    raise PartitionedFormatError(f"{_base(path)}: not a regular file")
  return st.size


def _volume(sl: Slices) -> int:
  return math.prod(b - a for a, b in sl)


def _fmt(sl: Slices) -> str:
  return "[" + ", ".join(f"{a}:{b}" for a, b in sl) + "]"


def _base(path: str) -> str:
  return os.path.basename(path) or path


def _short(x: Any, limit: int = 80) -> str:
  """A value for a one-line message: repr, one line, bounded."""
  text = repr(x) if not isinstance(x, BaseException) else str(x) or type(x).__name__
  text = " ".join(text.split())
  return text if len(text) <= limit else text[:limit - 3] + "..."
