"""The dropless dispatcher: every selected (token, expert) pair, no capacity.

A token-choice router run at C = S (an expert can take every token of a group,
so no choice overflows) gives a `Routing` holding all the pairs. They are
compacted into rows sorted by expert (expert-major, then group, then slot; a
cumulative sum over the valid slots gives each pair its row, no sort), and the
experts run as one grouped matrix product over the rows: expert e multiplies
the `group_sizes[e]` rows that follow the first e experts' rows. The rows are
then scaled by their combine weights and added back into their tokens. The row
count is static, the most pairs there can be: R = G*S*K (K experts per token);
rows past the pairs are zero and add nothing.

The grouped product is `jax.lax.ragged_dot` (its backward XLA's) on GPU and TPU,
where the pinned JAX lowers it to XLA's grouped product. On the CPU it lowers to
a dense product masked per expert (every row against every expert: E times the
work), so there the layer pads each expert's rows to blocks of `BLOCK_ROWS` and
loops over the blocks, skipping the unused ones (`block_matmul`, its backward
written by hand); R grows by E*(BLOCK_ROWS - 1) at most.

On a mesh with axes ('data', 'expert') the groups are split over every device
and the experts over 'expert' (`per_device`, in `jax.shard_map`): each device
gathers the tokens and routing of the n devices of its 'data' row (an
all-gather over 'expert', n = the 'expert' axis size), keeps the pairs of its
own E/n experts, runs them against its own expert parameters, and the partial
outputs are summed and split back to the groups' devices (a reduce-scatter
over 'expert'). A device's rows are at most the gathered groups' G*S*min(K,
E/n). The backward runs the same collectives transposed. Without such a mesh,
or when G or E does not divide over it, the layer runs the whole computation
as one program (`grouped_mlp`) and XLA places it.

Dropout (a rate > 0 in training) draws its own mask per row, the hidden and
the output alike; masks differ from the buffer dispatchers' and between meshes.
"""
import functools
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from vmoe_sparse_ot.nn.routing import Routing
from vmoe_sparse_ot.nn.sharding import EXPERT_AXIS
from vmoe_sparse_ot.nn.sharding import GROUP_AXES

Array = jax.Array
NAME = "dropless"
# Rows per block of `block_matmul`, the CPU's grouped product: large enough for an
# efficient matrix product, small against the rows (each expert pads to a block).
BLOCK_ROWS = 64


class ExpertParams(NamedTuple):
  """The experts' stacked parameters: wi (E, D, H), bi (E, H), wo (E, H, D), bo (E, D)."""
  wi: Array
  bi: Array
  wo: Array
  bo: Array


class Rows(NamedTuple):
  """The routing's pairs as R rows sorted by expert.

  Attributes:
    token: (R,) int32, the pair's token in the flattened (G*S) groups (0 past the pairs).
    expert: (R,) int32, the pair's expert (E past the pairs).
    weight: (R,) float, the pair's combine weight (0 past the pairs).
    group_sizes: (E,) int32, rows per expert; they sum to the number of pairs.
  """
  token: Array
  expert: Array
  weight: Array
  group_sizes: Array


def sorted_rows(routing: Routing, group_size: int, num_rows: int, block: int = 1) -> Rows:
  """The valid slots of a (G, E, C) `Routing`, compacted into `num_rows` rows sorted by expert.

  Each expert's rows start at a multiple of `block` (1: no gaps); the rows that pad
  an expert's last block belong to it, with weight 0.

  Args:
    routing: the slots; `valid` must hold at most `num_rows` pairs with the padding
      (extra ones are dropped).
    group_size: S, to number tokens across groups (token g*S + s).
    num_rows: R, the static row count.
    block: the row blocks that never mix experts.

  Returns:
    `Rows` (`group_sizes` counting each expert's padding), differentiable in
    `routing.combine_weight`.
  """
  g, e, c = routing.token_index.shape
  expert_major = lambda a: jnp.swapaxes(a, 0, 1).reshape(e * g * c)
  valid = expert_major(routing.valid)
  offsets = (jnp.arange(g, dtype=jnp.int32) * group_size)[:, None, None]
  token = expert_major(jax.lax.stop_gradient(routing.token_index) + offsets)
  counts = jnp.sum(routing.valid, axis=(0, 2), dtype=jnp.int32)
  sizes = -(-counts // block) * block
  shift = jnp.repeat(jnp.cumsum(sizes) - sizes - (jnp.cumsum(counts) - counts), g * c,
                     total_repeat_length=e * g * c)
  row = jnp.where(valid, jnp.cumsum(valid, dtype=jnp.int32) - 1 + shift, num_rows)

  def place(values, fill):
    return jnp.full((num_rows,), fill, values.dtype).at[row].set(values, mode="drop")

  weight = jnp.where(valid, expert_major(routing.combine_weight), 0)
  expert = jnp.searchsorted(jnp.cumsum(sizes), jnp.arange(num_rows, dtype=jnp.int32),
                            side="right").astype(jnp.int32)
  return Rows(place(token, 0), expert, place(weight, 0), sizes)


def default_block() -> int:
  """Row blocks of `BLOCK_ROWS` on the CPU (`block_matmul`), 1 elsewhere (`ragged_dot`)."""
  return BLOCK_ROWS if jax.default_backend() == "cpu" else 1


@jax.custom_vjp
def block_matmul(x: Array, w: Array, block_expert: Array, used: Array) -> Array:
  """y[rows of block i] = x[rows of block i] @ w[block_expert[i]]: (R, D) x (E, D, H) -> (R, H).

  R = nb blocks of equal size (nb = block_expert's length); blocks from `used` on are
  skipped (zero). A loop over the blocks, one (R/nb, D) x (D, H) product each, so the
  work is the used rows', where the CPU's `ragged_dot` multiplies every row by every
  expert. The backward (by hand) loops over the blocks too, adding each block's
  kernel gradient into its expert's.
  """
  return _block_products(x, w, block_expert, used)


def _block_products(x, w, block_expert, used):
  nb = block_expert.shape[0]
  xb = x.reshape(nb, -1, x.shape[-1])
  zero = jnp.zeros((xb.shape[1], w.shape[-1]), x.dtype)

  def body(_, inp):
    i, xi, ei = inp
    return None, jax.lax.cond(i < used, lambda: (xi @ w[ei]).astype(x.dtype), lambda: zero)

  _, y = jax.lax.scan(body, None, (jnp.arange(nb), xb, block_expert))
  return y.reshape(x.shape[0], w.shape[-1])


def _block_matmul_fwd(x, w, block_expert, used):
  return _block_products(x, w, block_expert, used), (x, w, block_expert, used)


def _block_matmul_bwd(res, ct):
  x, w, block_expert, used = res
  nb = block_expert.shape[0]
  xb, cb = x.reshape(nb, -1, x.shape[-1]), ct.reshape(nb, -1, ct.shape[-1])

  def body(dw, inp):
    i, xi, ci, ei = inp
    dxi = jax.lax.cond(i < used, lambda: (ci @ w[ei].T).astype(x.dtype),
                       lambda: jnp.zeros_like(xi))
    dw = jax.lax.cond(i < used, lambda d: d.at[ei].add(xi.astype(jnp.float32).T @ ci),
                      lambda d: d, dw)
    return dw, dxi

  dw, dx = jax.lax.scan(body, jnp.zeros(w.shape, jnp.float32),
                        (jnp.arange(nb), xb, cb, block_expert))
  return dx.reshape(x.shape), dw.astype(w.dtype), None, None


block_matmul.defvjp(_block_matmul_fwd, _block_matmul_bwd)


def _dropout(x: Array, rate: float, key: Optional[Array]) -> Array:
  if key is None or rate == 0.0:
    return x
  keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


def expert_mlp(x: Array, rows: Rows, params: ExpertParams, dropout_rate: float = 0.0,
               dropout_key: Optional[Array] = None, block: int = 1) -> Array:
  """Each row through its expert's two-layer GELU MLP: (R, D) -> (R, D), in x's dtype.

  `block` 1: `jax.lax.ragged_dot`; else `block_matmul` over the rows' blocks (the
  rows laid out by `sorted_rows` with that block). The biases of rows past the
  pairs are read from the last expert; those rows' weights are 0, so they add nothing.
  """
  e = params.wi.shape[0]
  expert = jnp.minimum(rows.expert, e - 1)
  keys = (None, None) if dropout_key is None else tuple(jax.random.split(dropout_key))
  if block == 1:
    matmul = lambda a, w: jax.lax.ragged_dot(a, w, rows.group_sizes,
                                             preferred_element_type=x.dtype)
  else:
    used = jnp.sum(rows.group_sizes) // block
    matmul = lambda a, w: block_matmul(a, w, expert[::block], used)
  h = matmul(x, params.wi.astype(x.dtype))
  h = jax.nn.gelu(h + params.bi[expert].astype(x.dtype))
  h = _dropout(h, dropout_rate, keys[0])
  y = matmul(h, params.wo.astype(x.dtype))
  return _dropout(y + params.bo[expert].astype(x.dtype), dropout_rate, keys[1])


def row_count(pairs: int, num_experts: int, block: int) -> int:
  """The static row count for at most `pairs` pairs in blocks of `block` rows per expert."""
  return -(-(pairs + num_experts * (block - 1)) // block) * block


def grouped_mlp(tokens: Array, routing: Routing, params: ExpertParams, max_pairs: int,
                dropout_rate: float = 0.0, dropout_key: Optional[Array] = None,
                compute_dtype=None, block: Optional[int] = None) -> Array:
  """y[g, s] = sum over the pairs (s, e) of w * Expert_e(x[g, s]): (G, S, D) -> (G, S, D).

  Args:
    tokens: (G, S, D).
    routing: (G, E, C) slots of the E experts in `params`.
    params: `ExpertParams` of E experts.
    max_pairs: at least the number of valid slots.
    dropout_rate, dropout_key: the experts' dropout (no key: none).
    compute_dtype: the dtype the tokens and expert outputs travel in (None: the
      tokens'); the weighted sum runs in the weights' dtype if wider.
    block: `expert_mlp`'s (None: `default_block()`).

  Returns:
    (G, S, D) in the tokens' dtype.
  """
  g, s, d = tokens.shape
  cast = (lambda a: a) if compute_dtype is None else (lambda a: a.astype(compute_dtype))
  block = default_block() if block is None else block
  e = params.wi.shape[0]
  rows = sorted_rows(routing, s, row_count(max_pairs, e, block), block)
  x = cast(tokens.reshape(g * s, d))[rows.token].astype(tokens.dtype)
  out = expert_mlp(x, rows, params, dropout_rate, dropout_key, block)
  weighted = cast(out) * rows.weight[:, None]
  y = jnp.zeros((g * s, d), weighted.dtype).at[rows.token].add(weighted)
  return y.astype(tokens.dtype).reshape(g, s, d)


def _mesh_split(mesh, num_groups: int, num_experts: int) -> Optional[int]:
  """n, the 'expert' axis size, when the groups and experts split over the mesh; else None."""
  if mesh.empty or set(GROUP_AXES) - set(mesh.axis_names):
    return None
  n_data, n_expert = mesh.shape["data"], mesh.shape[EXPERT_AXIS]
  if n_data * n_expert == 1 or num_groups % (n_data * n_expert) or num_experts % n_expert:
    return None
  return n_expert


def per_device(tokens: Array, routing: Routing, params: ExpertParams, experts_per_token: int,
               dropout_rate: float = 0.0, dropout_key: Optional[Array] = None,
               compute_dtype=None, block: Optional[int] = None) -> Array:
  """`grouped_mlp` of all the pairs, split over the current mesh as the module docstring says.

  Args:
    tokens: (G, S, D); routing: (G, E, C); params: of the E experts.
    experts_per_token: K, the most pairs a token has (R from it).
    dropout_rate, dropout_key, compute_dtype, block: as `grouped_mlp`.

  Returns:
    (G, S, D) in the tokens' dtype.
  """
  g, s, _ = tokens.shape
  e = params.wi.shape[0]
  mesh = jax.sharding.get_abstract_mesh()
  n = _mesh_split(mesh, g, e)
  if n is None:
    return grouped_mlp(tokens, routing, params, g * s * min(experts_per_token, e),
                       dropout_rate, dropout_key, compute_dtype, block)
  gathered = g // mesh.shape["data"]        # groups of one 'data' row
  local_experts = e // n
  max_pairs = gathered * s * min(experts_per_token, local_experts)

  def local(tokens, token_index, valid, weight, params, *key):
    gather = functools.partial(jax.lax.all_gather, axis_name=EXPERT_AXIS, axis=0, tiled=True)
    start = jax.lax.axis_index(EXPERT_AXIS) * local_experts
    mine = lambda a: jax.lax.dynamic_slice_in_dim(gather(a), start, local_experts, axis=1)
    sub = Routing(mine(token_index), mine(valid), mine(weight), None, None)
    # Each device draws its own rows' dropout masks.
    key = jax.random.fold_in(jax.random.fold_in(key[0], jax.lax.axis_index("data")),
                             jax.lax.axis_index(EXPERT_AXIS)) if key else None
    y = grouped_mlp(gather(tokens), sub, params, max_pairs, dropout_rate, key, compute_dtype,
                    block)
    return jax.lax.psum_scatter(y, EXPERT_AXIS, scatter_dimension=0, tiled=True)

  groups, experts = P(GROUP_AXES), P(EXPERT_AXIS)
  keys = () if dropout_key is None else (dropout_key,)
  # check_vma=False: `block_matmul`'s loop skips unused blocks with lax.cond, whose
  # zero branch does not say how it varies over the mesh; the transpose then sums
  # the expert parameters' gradients over 'data' (the axis their spec leaves out).
  fn = jax.shard_map(local, mesh=mesh, out_specs=groups, check_vma=False,
                     in_specs=(groups, groups, groups, groups,
                               ExpertParams(experts, experts, experts, experts),
                               *(P(),) * len(keys)))
  return fn(tokens, routing.token_index, routing.valid, routing.combine_weight, params, *keys)
