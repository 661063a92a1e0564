"""E³ ensemble routing (Efficient Ensembles of Experts, Allingham et al. 2022).

With `model.ensemble_size` M > 1 the encoder repeats each image's tokens M times
before its first MoE block (`jnp.repeat` on the batch axis: rows b*M .. b*M + M-1
are image b's M members), and every MoE layer partitions its E experts into M
blocks of E/M: member m routes only among experts m*E/M .. (m+1)*E/M - 1, K per
token. The head then gives one prediction per member, (B*M, classes), and the
members are combined by the mean of their probabilities (`train.losses`).

How a MoE layer routes (as the reference's ensemble router, whose gates are
block-diagonal over (member, expert block)):
- `interleave`: the (B*M, N, D) tokens are flattened in (image, token, member)
  order, so a group of S tokens (S a multiple of M) holds S/M tokens of each
  member, member m at positions m, m + M, ...
- `member_problems`: each (group, member) becomes a routing problem of its own,
  (G*M, S/M) tokens over E/M experts, whose logits are the member's columns of
  the router's (G, S, E) logits: the same parameters as the V-MoE's router layer
  (a kernel (D, E), which the reference stores as (D, M, E/M)).
- The router runs on these G*M problems unchanged (with C from S/M and E/M, the
  same C as from S and E), and `full_routing` maps the result back to (G, E, C)
  slots of the layer's groups: expert e' of member m is expert m*E/M + e', token
  s' of member m is token s'*M + m. No token can reach another member's expert.
- `deinterleave` puts the tokens back in (image, member, token) order.

Any stateless router with the default logits layer (a Dense(E) on the tokens)
works this way (`supports`); the others are refused when the model is built.
With M = 1 none of this runs: the model is the V-MoE.

Shapes: G groups, S tokens per group, E experts, C capacity, M members, B images,
N tokens per image, D hidden size.
"""
from typing import Tuple

import jax
import jax.numpy as jnp

from vmoe_sparse_ot.nn import routing as rt
from vmoe_sparse_ot.nn.routers import base

Array = jax.Array
KEY = "model.ensemble_size"


def supports(router: base.Router) -> bool:
  """Whether `router` can route E³ members: stateless, with the default logits layer."""
  return router.state is None and router.logits_module is base.dense_logits


def interleave(x: Array, ensemble_size: int) -> Array:
  """(B*M, N, D) -> (B*N*M, D): tokens in (image, token, member) order."""
  bm, n, d = x.shape
  x = x.reshape(bm // ensemble_size, ensemble_size, n, d)
  return jnp.swapaxes(x, 1, 2).reshape(-1, d)


def deinterleave(tokens: Array, batch: int, num_tokens: int, ensemble_size: int) -> Array:
  """(B*N*M, ...) -> (B*M, N, ...): the inverse of `interleave` (B = `batch`)."""
  rest = tokens.shape[1:]
  x = tokens.reshape(batch, num_tokens, ensemble_size, *rest)
  return jnp.swapaxes(x, 1, 2).reshape(batch * ensemble_size, num_tokens, *rest)


def member_problems(logits: Array, token_mask: Array, ensemble_size: int
                    ) -> Tuple[Array, Array]:
  """(G, S, E) logits, (G, S) mask -> (G*M, S/M, E/M) logits, (G*M, S/M) mask.

  Problem g*M + m holds member m's tokens of group g and its own experts' logits.
  """
  g, s, e = logits.shape
  m = ensemble_size
  x = logits.reshape(g, s // m, m, m, e // m)     # (G, S/M, token's member, expert block, E/M)
  x = jnp.diagonal(x, axis1=2, axis2=3)           # (G, S/M, E/M, M): each token's own block
  x = jnp.transpose(x, (0, 3, 1, 2)).reshape(g * m, s // m, e // m)
  mask = jnp.swapaxes(token_mask.reshape(g, s // m, m), 1, 2).reshape(g * m, s // m)
  return x, mask


def full_routing(sub: rt.Routing, ensemble_size: int) -> rt.Routing:
  """The (G*M, E/M, C) routing of `member_problems` as (G, E, C) slots of the groups."""
  gm, em, c = sub.token_index.shape
  m = ensemble_size
  member = jnp.arange(m, dtype=sub.token_index.dtype)[None, :, None, None]
  token_index = sub.token_index.reshape(gm // m, m, em, c) * m + member
  return sub._replace(token_index=token_index.reshape(gm // m, m * em, c),
                      valid=sub.valid.reshape(gm // m, m * em, c),
                      combine_weight=sub.combine_weight.reshape(gm // m, m * em, c))


def member_routing(sub: rt.Routing, token_mask: Array, ensemble_size: int, member: int
                   ) -> Tuple[rt.Routing, Array]:
  """Member `member`'s own (G, E/M, C) routing and (G, S/M) mask, from `member_problems`'."""
  gm, em, c = sub.token_index.shape
  m = ensemble_size

  def pick(x):
    return x.reshape(gm // m, m, *x.shape[1:])[:, member]

  return (sub._replace(token_index=pick(sub.token_index), valid=pick(sub.valid),
                       combine_weight=pick(sub.combine_weight)), pick(token_mask))


def image_order(weights: Array, batch: int, num_tokens: int, ensemble_size: int) -> Array:
  """(G, S, E) per-token weights of the layer's groups -> (G, S, E) with the tokens in
  (image, member, token) order, as a V-MoE of B*M images would hold them (the
  readers of `expert_weights`, `nn.routing_stats`, then see B*M images)."""
  g, s, e = weights.shape
  t = batch * num_tokens * ensemble_size
  x = deinterleave(weights.reshape(g * s, e)[:t], batch, num_tokens, ensemble_size)
  return jnp.pad(x.reshape(t, e), ((0, g * s - t), (0, 0))).reshape(g, s, e)
