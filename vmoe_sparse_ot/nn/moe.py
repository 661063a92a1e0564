"""Sparse Mixture-of-Experts MLP layer.

Tokens (B, N, D) are flattened and cut into G groups of S tokens (the last group
padded with masked tokens if needed), routed per group, dispatched into expert
buffers (G, E, C, D), processed by E MLPs as one batched computation with
stacked parameters (E, D, H) / (E, H, D), and combined back. Tokens an expert
does not take (over capacity) get 0 from the layer and keep only the residual.
With `dispatcher='dropless'` (`nn.dropless`, token-choice routers only) there is
no capacity: the router runs at C = S, and the experts (same parameters) run
on every selected (token, expert) pair as one grouped matrix product.
`num_shared_experts` dense MLPs (`shared_experts`, DeepSeekMoE) take every token,
and their sum is added to the routed output.

The router is a plug-in (`nn/routers/`): the layer asks it for the buffer size
C, its logits layer (named 'router'), and whether it needs the 'gating' rng,
and gets back a `Routing` (slot assignment) or a `SoftRouting` (dense weights),
which the dispatcher handles alike. A stateful router's state (e.g.
`topk_bias`'s bias) is the layer's 'router_state' variables, and in training its
statistics go to 'router_stats' when that collection is mutable (`nn.router_state`).

For analysis the layer sows `intermediates/expert_weights`, float32 (G, S, E):
the total combine weight each token receives from each expert (0 where not
dispatched). Read it with `model.apply(..., mutable=['intermediates'])`.

On a mesh with axes ('data', 'expert'), groups are split over both axes and the
expert buffers (E, G*C, D) and expert parameters over 'expert', so XLA moves
tokens between the two layouts with all-to-alls.

With `ensemble_size` M > 1 (E³, `nn.ensemble`) the input holds M copies of each
image, (B*M, N, D); the tokens are grouped in (image, token, member) order, and
member m routes only among its own E/M experts. The layer also reports each
member's common metrics as `member{m}/<name>`, and sows `expert_weights` with the
tokens in (image, member, token) order.
"""
import math
from typing import Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from vmoe_sparse_ot.nn import dropless
from vmoe_sparse_ot.nn import ensemble
from vmoe_sparse_ot.nn import router_health
from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn import router_state
from vmoe_sparse_ot.nn.dispatch import get_dispatcher
from vmoe_sparse_ot.nn.routing import expert_weights
from vmoe_sparse_ot.nn.routing_metrics import common_metrics
from vmoe_sparse_ot.nn.sharding import EXPERT_AXIS
from vmoe_sparse_ot.nn.sharding import GROUP_AXES
from vmoe_sparse_ot.nn.sharding import constrain

Array = jax.Array


def _alike(init: Callable) -> Callable:
  """An initializer of (E, ...) that draws one (1, ...) array and repeats it E times."""
  def init_fn(key, shape, dtype=jnp.float32):
    return jnp.broadcast_to(init(key, (1, *shape[1:]), dtype), shape)
  return init_fn


class Experts(nn.Module):
  """E two-layer GELU MLPs applied to their own buffers: (E, M, D) -> (E, M, D).

  `split_rngs` has the meaning of the reference V-MoE's option: False (its
  default and its configs') initializes every expert alike -- one draw of each
  parameter, repeated E times -- and draws one dropout mask for all experts'
  buffers; True draws each expert's parameters and dropout independently. Each
  expert's kernels are Xavier-uniform over their own (fan in, fan out) either way.
  """
  num_experts: int
  mlp_dim: int
  dropout_rate: float = 0.0
  split_rngs: bool = False
  # Initializers of the stacked (E, ...) parameters; the kernels' fans exclude E.
  kernel_init: Callable = nn.initializers.xavier_uniform(batch_axis=(0,))
  bias_init: Callable = nn.initializers.normal(stddev=1e-6)

  def stacked_params(self, e: int, d: int) -> dropless.ExpertParams:
    """Declares the E experts' parameters (for tokens of size D), the kernels laid out
    over 'expert'."""
    init = (lambda f: f) if self.split_rngs else _alike
    wi = self.param("wi_kernel", init(self.kernel_init), (e, d, self.mlp_dim))
    bi = self.param("wi_bias", init(self.bias_init), (e, self.mlp_dim))
    wo = self.param("wo_kernel", init(self.kernel_init), (e, self.mlp_dim, d))
    bo = self.param("wo_bias", init(self.bias_init), (e, d))
    return dropless.ExpertParams(constrain(wi, (EXPERT_AXIS,)), bi,
                                 constrain(wo, (EXPERT_AXIS,)), bo)

  @nn.compact
  def __call__(self, x: Array, train: bool) -> Array:
    e, _, d = x.shape
    wi, bi, wo, bo = self.stacked_params(e, d)
    # One mask shared along the expert axis when the experts share their rngs.
    broadcast = () if self.split_rngs else (0,)
    # Matrix products and biases in the tokens' dtype (bfloat16 under model.dtype).
    h = jnp.einsum("emd,edh->emh", x, wi.astype(x.dtype)) + bi[:, None, :].astype(x.dtype)
    h = nn.gelu(h)
    h = nn.Dropout(self.dropout_rate, broadcast_dims=broadcast)(h, deterministic=not train)
    y = jnp.einsum("emh,ehd->emd", h, wo.astype(x.dtype)) + bo[:, None, :].astype(x.dtype)
    return nn.Dropout(self.dropout_rate, broadcast_dims=broadcast)(y, deterministic=not train)


class DroplessExperts(Experts):
  """The same E MLPs and parameters as `Experts`, run on every (token, expert) pair of
  a (G, E, C) `Routing` (`nn.dropless`): tokens (G, S, D) -> weighted sums (G, S, D).

  Dropout draws one mask per pair, whatever `split_rngs`.
  """

  @nn.compact
  def __call__(self, tokens: Array, routing, experts_per_token: int,
               compute_dtype: Optional[str], train: bool) -> Array:
    params = self.stacked_params(self.num_experts, tokens.shape[-1])
    rate = self.dropout_rate if train else 0.0
    key = self.make_rng("dropout") if rate > 0 else None
    return dropless.per_device(tokens, routing, params, experts_per_token, rate, key,
                               None if compute_dtype is None else jnp.dtype(compute_dtype))


class MoeLayer(nn.Module):
  """Routes tokens to E expert MLPs.

  Returns (y like x, auxiliary_loss scalar (differentiable: the router's, plus
  `z_loss_weight` times its z-loss), metrics {name: scalar}: the common ones of
  `nn.routing_metrics`, those of `nn.router_health` and the router's own).
  """
  num_experts: int
  mlp_dim: int
  group_size: int
  router: routers.RouterConfig
  dispatcher: str = "indices"
  routed_tokens_dtype: Optional[str] = None
  dropout_rate: float = 0.0
  split_rngs: bool = False
  ensemble_size: int = 1   # M: E³ members (nn.ensemble); 1 is the V-MoE
  num_shared_experts: int = 0   # dense MLPs every token passes through (DeepSeekMoE)

  @nn.compact
  def __call__(self, x: Array, train: bool):
    b, n, d = x.shape
    t = b * n
    s = self.group_size
    g = math.ceil(t / s)
    m = self.ensemble_size
    tokens = ensemble.interleave(x, m) if m > 1 else x.reshape(t, d)
    if g * s != t:
      tokens = jnp.pad(tokens, ((0, g * s - t), (0, 0)))
    tokens = constrain(tokens.reshape(g, s, d), (GROUP_AXES,))
    token_mask = (jnp.arange(g * s) < t).reshape(g, s)
    router = routers.get_router(self.router.name)
    opts = self.router.options
    capacity = router.capacity(opts, s // m, self.num_experts // m)
    if self.dispatcher == dropless.NAME:   # Every choice fits: C = S.
      per_token = router.experts_per_token(opts, self.num_experts // m)
      if per_token is None:
        raise ValueError(f"dispatcher 'dropless' needs a token-choice router, not "
                         f"{self.router.name!r}")
      capacity = s // m

    logits = router.logits_module(opts, self.num_experts, capacity, "router")(tokens)
    rng = self.make_rng("gating") if router.needs_rng(opts, train) else None
    logits = logits.astype(jnp.float32)
    member_metrics = {}
    if m > 1:  # E³: G*M problems of S/M tokens over E/M experts (nn.ensemble).
      sub_logits, sub_mask = ensemble.member_problems(logits, token_mask, m)
      sub = router.route(sub_logits, sub_mask, opts, capacity, train, rng)
      for i in range(m):
        own, own_mask = ensemble.member_routing(sub, sub_mask, m, i)
        member_metrics.update({f"member{i}/{k}": v
                               for k, v in common_metrics(own, own_mask).items()})
      routing = ensemble.full_routing(sub, m)
    elif router.state is None:
      routing = router.route(logits, token_mask, opts, capacity, train, rng)
    else:
      init = router.state.init(opts, self.num_experts)
      state = {name: self.variable(router_state.STATE, name, lambda v=v: v).value
               for name, v in init.items()}
      routing, statistics = router.route(logits, token_mask, opts, capacity, train, rng,
                                         state=state)
      if train and self.is_mutable_collection(router_state.STATISTICS):
        for name, value in statistics.items():
          self.put_variable(router_state.STATISTICS, name, value)
    # Health and z-loss on the logits the router routes with (E³: each member's own).
    # Without the z-loss the metrics are read behind a barrier, so that XLA does not
    # fuse their softmax with the router's: the routing stays bit-identical to a
    # model without them.
    seen = logits if opts.z_loss_weight else jax.lax.optimization_barrier(
        jax.lax.stop_gradient(logits))
    health, z = router_health.logit_metrics(
        *(ensemble.member_problems(seen, token_mask, m) if m > 1 else (seen, token_mask)))
    if self.is_mutable_collection("intermediates"):
      weights = expert_weights(routing, s)
      if m > 1:
        weights = ensemble.image_order(weights, b // m, n, m)
      self.sow("intermediates", "expert_weights", weights)

    if self.dispatcher == dropless.NAME:
      y = DroplessExperts(self.num_experts, self.mlp_dim, self.dropout_rate, self.split_rngs,
                          name="experts")(tokens, routing, per_token,
                                          self.routed_tokens_dtype, train)
    else:
      y = self._buffered(tokens, routing, capacity, train)
    if self.num_shared_experts:
      y = y + self._shared(tokens, train)
    y = constrain(y, (GROUP_AXES,))
    y = y.reshape(g * s, d)[:t]
    y = ensemble.deinterleave(y, b // m, n, m) if m > 1 else y.reshape(b, n, d)
    metrics = {**common_metrics(routing, token_mask), **health, **routing.metrics,
               **member_metrics}
    return y, router_health.with_z_loss(routing.auxiliary_loss, z, opts.z_loss_weight), metrics

  def _buffered(self, tokens: Array, routing, capacity: int, train: bool) -> Array:
    """The experts on (E, G*C, D) buffers: tokens (G, S, D) -> (G, S, D)."""
    g, s, d = tokens.shape
    dispatch, combine = get_dispatcher(self.dispatcher, self.routed_tokens_dtype)
    buf = dispatch(tokens, routing)                                  # (G, E, C, D)
    buf = jnp.swapaxes(buf, 0, 1).reshape(self.num_experts, g * capacity, d)
    buf = constrain(buf, (EXPERT_AXIS,))
    out = Experts(self.num_experts, self.mlp_dim, self.dropout_rate, self.split_rngs,
                  name="experts")(buf, train)
    out = constrain(out, (EXPERT_AXIS,))
    out = jnp.swapaxes(out.reshape(self.num_experts, g, capacity, d), 0, 1)
    out = constrain(out, (GROUP_AXES,))
    return combine(out, routing, s)                                  # (G, S, D)

  def _shared(self, tokens: Array, train: bool) -> Array:
    """The sum of the shared experts' outputs, every token through each: (G, S, D)."""
    g, s, d = tokens.shape
    n = self.num_shared_experts
    every = jnp.broadcast_to(tokens.reshape(1, g * s, d), (n, g * s, d))
    # Drawn apart whatever split_rngs: experts alike would stay alike (same gradients).
    out = Experts(n, self.mlp_dim, self.dropout_rate, split_rngs=True,
                  name="shared_experts")(every, train)
    return jnp.sum(out, axis=0).reshape(g, s, d)
