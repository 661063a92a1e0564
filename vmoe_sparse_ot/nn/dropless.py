"""The dropless dispatcher: every selected (token, expert) pair, no capacity.

A token-choice router run at C = S (an expert can take every token of a group,
so no choice overflows) gives a `Routing` holding all the pairs. They are
compacted into rows sorted by expert (expert-major, then group, then slot; a
cumulative sum over the valid slots gives each pair its row, no sort), and the
experts run as one grouped matrix product over the rows (`jax.lax.ragged_dot`,
whose backward XLA provides): expert e multiplies the `group_sizes[e]` rows
that follow the first e experts' rows. The rows are then scaled by their
combine weights and added back into their tokens. The row count is static, the
most pairs there can be: R = G*S*K (K experts per token); rows past the pairs
are zero and add nothing. (The pinned JAX lowers `ragged_dot` natively on GPU
and TPU; on the CPU as a dense product masked per expert, E times the work.)

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


def sorted_rows(routing: Routing, group_size: int, num_rows: int) -> Rows:
  """The valid slots of a (G, E, C) `Routing`, compacted into `num_rows` rows sorted by expert.

  Args:
    routing: the slots; `valid` must hold at most `num_rows` pairs (extra ones are dropped).
    group_size: S, to number tokens across groups (token g*S + s).
    num_rows: R, the static row count.

  Returns:
    `Rows`, differentiable in `routing.combine_weight`.
  """
  g, e, c = routing.token_index.shape
  expert_major = lambda a: jnp.swapaxes(a, 0, 1).reshape(e * g * c)
  valid = expert_major(routing.valid)
  offsets = (jnp.arange(g, dtype=jnp.int32) * group_size)[:, None, None]
  token = expert_major(jax.lax.stop_gradient(routing.token_index) + offsets)
  expert = jnp.repeat(jnp.arange(e, dtype=jnp.int32), g * c)
  row = jnp.where(valid, jnp.cumsum(valid, dtype=jnp.int32) - 1, num_rows)

  def place(values, fill):
    return jnp.full((num_rows,), fill, values.dtype).at[row].set(values, mode="drop")

  weight = jnp.where(valid, expert_major(routing.combine_weight), 0)
  group_sizes = jnp.sum(routing.valid, axis=(0, 2), dtype=jnp.int32)
  return Rows(place(token, 0), place(expert, e), place(weight, 0), group_sizes)


def _dropout(x: Array, rate: float, key: Optional[Array]) -> Array:
  if key is None or rate == 0.0:
    return x
  keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), 0).astype(x.dtype)


def expert_mlp(x: Array, rows: Rows, params: ExpertParams, dropout_rate: float = 0.0,
               dropout_key: Optional[Array] = None) -> Array:
  """Each row through its expert's two-layer GELU MLP: (R, D) -> (R, D), in x's dtype.

  The biases of rows past the pairs are read from the last expert; those rows'
  weights are 0, so they add nothing.
  """
  e = params.wi.shape[0]
  expert = jnp.minimum(rows.expert, e - 1)
  keys = (None, None) if dropout_key is None else tuple(jax.random.split(dropout_key))
  h = jax.lax.ragged_dot(x, params.wi.astype(x.dtype), rows.group_sizes,
                         preferred_element_type=x.dtype)
  h = jax.nn.gelu(h + params.bi[expert].astype(x.dtype))
  h = _dropout(h, dropout_rate, keys[0])
  y = jax.lax.ragged_dot(h, params.wo.astype(x.dtype), rows.group_sizes,
                         preferred_element_type=x.dtype)
  return _dropout(y + params.bo[expert].astype(x.dtype), dropout_rate, keys[1])


def grouped_mlp(tokens: Array, routing: Routing, params: ExpertParams, num_rows: int,
                dropout_rate: float = 0.0, dropout_key: Optional[Array] = None,
                compute_dtype=None) -> Array:
  """y[g, s] = sum over the pairs (s, e) of w * Expert_e(x[g, s]): (G, S, D) -> (G, S, D).

  Args:
    tokens: (G, S, D).
    routing: (G, E, C) slots of the E experts in `params`.
    params: `ExpertParams` of E experts.
    num_rows: R >= the number of valid slots.
    dropout_rate, dropout_key: the experts' dropout (no key: none).
    compute_dtype: the dtype the tokens and expert outputs travel in (None: the
      tokens'); the weighted sum runs in the weights' dtype if wider.

  Returns:
    (G, S, D) in the tokens' dtype.
  """
  g, s, d = tokens.shape
  cast = (lambda a: a) if compute_dtype is None else (lambda a: a.astype(compute_dtype))
  rows = sorted_rows(routing, s, num_rows)
  x = cast(tokens.reshape(g * s, d))[rows.token].astype(tokens.dtype)
  out = expert_mlp(x, rows, params, dropout_rate, dropout_key)
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
               compute_dtype=None) -> Array:
  """`grouped_mlp` of all the pairs, split over the current mesh as the module docstring says.

  Args:
    tokens: (G, S, D); routing: (G, E, C); params: of the E experts.
    experts_per_token: K, the most pairs a token has (R from it).
    dropout_rate, dropout_key, compute_dtype: as `grouped_mlp`.

  Returns:
    (G, S, D) in the tokens' dtype.
  """
  g, s, _ = tokens.shape
  e = params.wi.shape[0]
  mesh = jax.sharding.get_abstract_mesh()
  n = _mesh_split(mesh, g, e)
  if n is None:
    return grouped_mlp(tokens, routing, params, g * s * min(experts_per_token, e),
                       dropout_rate, dropout_key, compute_dtype)
  gathered = g // mesh.shape["data"]        # groups of one 'data' row
  local_experts = e // n
  num_rows = gathered * s * min(experts_per_token, local_experts)

  def local(tokens, token_index, valid, weight, params, *key):
    gather = functools.partial(jax.lax.all_gather, axis_name=EXPERT_AXIS, axis=0, tiled=True)
    start = jax.lax.axis_index(EXPERT_AXIS) * local_experts
    mine = lambda a: jax.lax.dynamic_slice_in_dim(gather(a), start, local_experts, axis=1)
    sub = Routing(mine(token_index), mine(valid), mine(weight), None, None)
    # Each device draws its own rows' dropout masks.
    key = jax.random.fold_in(jax.random.fold_in(key[0], jax.lax.axis_index("data")),
                             jax.lax.axis_index(EXPERT_AXIS)) if key else None
    y = grouped_mlp(gather(tokens), sub, params, num_rows, dropout_rate, key, compute_dtype)
    return jax.lax.psum_scatter(y, EXPERT_AXIS, scatter_dimension=0, tiled=True)

  groups, experts = P(GROUP_AXES), P(EXPERT_AXIS)
  keys = () if dropout_key is None else (dropout_key,)
  fn = jax.shard_map(local, mesh=mesh, out_specs=groups,
                     in_specs=(groups, groups, groups, groups,
                               ExpertParams(experts, experts, experts, experts),
                               *(P(),) * len(keys)))
  return fn(tokens, routing.token_index, routing.valid, routing.combine_weight, params, *keys)
