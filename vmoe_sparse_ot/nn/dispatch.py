"""Dispatchers: move tokens into expert buffers and expert outputs back.

Both take a `Routing` (expert-side slot assignment) and compute the same thing:
  dispatch: buf[g, e, c] = x[g, token_index[g, e, c]]           (0 if slot empty)
  combine:  y[g, s] = sum_{e, c : token_index[g,e,c] = s} w[g, e, c] * out[g, e, c]
'indices' does it with a gather and a scatter-add (O(G*E*C*D) work, the default);
'einsum' builds one-hot (G, S, E, C) tensors (O(G*S*E*C*D) work, the classic
V-MoE formulation, kept as a reference and for hardware where einsums are cheap).

A `SoftRouting` (dense weights, Soft MoE) has no index form: both dispatchers
compute it with the two einsums buf = sum_s D[g,s,e,c] x[g,s] and
y[g,s] = sum_{e,c} W[g,s,e,c] out[g,e,c].

`dtype` (e.g. bfloat16, as V-MoE runs its einsum dispatcher) casts the data
for the dispatch/combine computation only, as the reference's Bfloat16Dispatcher:
the routing weights keep their dtype (float32), so the weighted sums (the
combine, Soft MoE's dispatch) run and round in float32; results come back in the
input's dtype.
"""
from typing import Dict, Optional

import jax
import jax.numpy as jnp

from vmoe_sparse_ot.nn.routing import Routing, SoftRouting

Array = jax.Array
DTYPES = ("float32", "bfloat16")


def _indices_dispatch(x: Array, r: Routing) -> Array:
  g, e, c = r.token_index.shape
  buf = jnp.take_along_axis(x, r.token_index.reshape(g, e * c, 1), axis=1)
  buf = buf * r.valid.reshape(g, e * c, 1).astype(x.dtype)
  return buf.reshape(g, e, c, x.shape[-1])


def _indices_combine(out: Array, r: Routing, group_size: int) -> Array:
  g, e, c, d = out.shape
  weighted = out * r.combine_weight[..., None]   # In the weights' dtype if wider.

  def scatter(idx, v):
    return jnp.zeros((group_size, d), weighted.dtype).at[idx].add(v)

  return jax.vmap(scatter)(r.token_index.reshape(g, e * c), weighted.reshape(g, e * c, d))


def _dispatch_mask(r: Routing, group_size: int, dtype) -> Array:
  onehot = jax.nn.one_hot(r.token_index, group_size, dtype=dtype)   # (G,E,C,S)
  return onehot * r.valid[..., None].astype(dtype)


def _einsum_dispatch(x: Array, r: Routing) -> Array:
  mask = _dispatch_mask(r, x.shape[1], x.dtype)
  return jnp.einsum("gecs,gsd->gecd", mask, x)


def _einsum_combine(out: Array, r: Routing, group_size: int) -> Array:
  combine = _dispatch_mask(r, group_size, r.combine_weight.dtype) * r.combine_weight[..., None]
  return jnp.einsum("gecs,gecd->gsd", combine, out)


def _soft_dispatch(x: Array, r: SoftRouting) -> Array:
  return jnp.einsum("gsec,gsd->gecd", r.dispatch_weight, x)


def _soft_combine(out: Array, r: SoftRouting, group_size: int) -> Array:
  del group_size
  return jnp.einsum("gsec,gecd->gsd", r.combine_weight, out)


DISPATCHERS: Dict[str, tuple] = {
    "indices": (_indices_dispatch, _indices_combine),
    "einsum": (_einsum_dispatch, _einsum_combine),
}


def get_dispatcher(name: str, dtype: Optional[str] = None):
  """Returns (dispatch(x, routing), combine(out, routing, group_size)).

  name: 'indices' or 'einsum'. dtype: None (compute in the input's dtype),
  'float32' or 'bfloat16'.
  """
  if name not in DISPATCHERS:
    raise ValueError(f"dispatcher must be one of {sorted(DISPATCHERS)}, got {name!r}")
  if dtype is not None and dtype not in DTYPES:
    raise ValueError(f"dispatcher dtype must be None or one of {list(DTYPES)}, got {dtype!r}")
  sparse_dispatch, sparse_combine = DISPATCHERS[name]
  compute = None if dtype is None else jnp.dtype(dtype)

  def cast(x: Array) -> Array:
    return x if compute is None else x.astype(compute)

  def dispatch(x: Array, r) -> Array:
    buf = (_soft_dispatch(cast(x), r) if isinstance(r, SoftRouting)
           else sparse_dispatch(cast(x), r))
    return buf.astype(x.dtype)

  def combine(out: Array, r, group_size: int) -> Array:
    fn = _soft_combine if isinstance(r, SoftRouting) else sparse_combine
    return fn(cast(out), r, group_size).astype(out.dtype)

  return dispatch, combine
