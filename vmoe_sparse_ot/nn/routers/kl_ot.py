"""'kl_ot': entropic OT routing by KL projection (the paper's S-BASE comparison).

Per group, the entropic OT plan (strength epsilon) of cost -logits, mass 1 per
real token and (real tokens)/E per expert (`sbase.masses`): the KL projection of
exp(logits / epsilon) onto the transportation polytope. Found by `num_iters`
log-domain Sinkhorn iterations from zero potentials, the expert potential updated
first (token rows exact, as OTT's Sinkhorn: `sbase.entropic_plans`), or with
solver='lbfgs' by L-BFGS on the semi-dual over the token potentials (at most
num_iters iterations, stopping once max |grad| <= 1e-3). In training the logits
get Gaussian noise of std noise_std / E first (TopK's key and scale).

Forms: 'token_choice' (the reference's KLProjectionNoisyTopExpertsPerItemRouter):
each token takes the top-K experts of its plan row, slots as in TopK (C from S K
/ E); 'expert_choice' (its ...TopItemsPerExpertRouter): each expert the top-C
tokens of its plan column (C from S / E).

Combine weights at the dispatched pairs: softmax of the logits, or the plan's
entries (`combine_weights='plan'`), differentiated implicitly through the solve
(`implicit_differentiation`, the reference's default; `nn.routers.implicit`) or
through the unrolled Sinkhorn iterations (L-BFGS: always implicitly). As the
reference's token-choice router, its softmax combine weights are of the clean
logits even when noise chose the plan (the expert-choice form's are of the noisy
logits). Auxiliary losses as TopK's, with weights `importance_loss_weight` (on
the clean softmax) and `load_loss_weight` (training with noise), 0 by default as
the reference's; each reported when its weight is > 0.
"""
import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.nn import routing as rt
from vmoe_sparse_ot.nn.routers import base
from vmoe_sparse_ot.nn.routers import expert_choice
from vmoe_sparse_ot.nn.routers import implicit
from vmoe_sparse_ot.nn.routers import sbase
from vmoe_sparse_ot.nn.routers import sparse_ot
from vmoe_sparse_ot.nn.routers import topk

Array = jax.Array
# The reference's L-BFGS stop rule (on the gradient's size; here its largest entry).
LBFGS_TOL = 1e-3


@dataclasses.dataclass(frozen=True)
class KLOTOptions(base.CommonOptions):
  noise_std: Optional[float] = base.option(
      1.0, "Gate noise in training, in units of 1/E (std noise_std / E, as TopK's); 0 "
      "disables it. None: 1.0.", check=base.NON_NEGATIVE, top_level=True)
  form: str = base.option(
      "token_choice", "'token_choice': each token its top-K experts by plan; "
      "'expert_choice': each expert its top-C tokens by plan.",
      choices=("token_choice", "expert_choice"))
  solver: str = base.option(
      "sinkhorn", "'sinkhorn' (num_iters iterations) or 'lbfgs' (the reference's "
      "use_lbfgs: at most num_iters L-BFGS iterations on the semi-dual).",
      choices=("sinkhorn", "lbfgs"))
  num_iters: int = base.option(20, "Solver iterations (the reference's maxiter).",
                               check=base.AT_LEAST_ONE)
  epsilon: float = base.option(1.0, "Entropic regularization (1 there).", check=base.POSITIVE)
  combine_weights: str = base.option(
      "softmax", "'softmax' (of the logits) or 'plan' (its entries, with a gradient), as "
      "the reference's use_softmax_combine_weights True / False.",
      choices=sparse_ot.COMBINE_WEIGHTS)
  implicit_differentiation: bool = base.option(
      True, "Plan combine weights: gradients by implicit differentiation through the "
      "solve (the reference's default); False: through the unrolled Sinkhorn iterations.")
  importance_loss_weight: float = base.option(
      0.0, "Weight of TopK's importance loss (0 by default, as the reference's).",
      check=base.NON_NEGATIVE)
  load_loss_weight: float = base.option(
      0.0, "Weight of TopK's load loss (0 by default, as the reference's).",
      check=base.NON_NEGATIVE)


def capacity(opts: KLOTOptions, group_size: int, num_experts: int) -> int:
  if opts.form == "expert_choice":
    return expert_choice.capacity(opts, group_size, num_experts)
  return base.default_capacity(opts, group_size, num_experts)


def _sinkhorn_potentials(cost: Array, tokens: Array, experts: Array, opts: KLOTOptions):
  """Expert potentials (E,) after num_iters iterations, expert side first (one group)."""
  return ot.sinkhorn(experts, tokens, cost.T, opts.epsilon, max_iter=opts.num_iters,
                     tol=0.0).f


def _lbfgs_potentials(cost: Array, tokens: Array, experts: Array, opts: KLOTOptions):
  """Token potentials (S,) from L-BFGS on the semi-dual, from zero (one group)."""
  # ot.solve's tol is relative to sum(a) = S (fewer with padding).
  return ot.solve(tokens, experts, cost, ot.NegEntropy(opts.epsilon), formulation="semi_dual",
                  solver=ot.LBFGS(), max_iter=opts.num_iters,
                  tol=LBFGS_TOL / tokens.shape[0], init=jnp.zeros_like(tokens)).alpha


def plans(logits: Array, token_mask: Array, opts: KLOTOptions,
          differentiable: bool = True) -> Array:
  """(G, S, E) entropic plans of (G, S, E) logits; differentiable in the logits as the
  options say, or (not `differentiable`) with no gradient."""
  tokens, experts = sbase.masses(jnp.asarray(token_mask), logits.shape[-1])
  cost = -logits.astype(jnp.float32)
  if not differentiable:
    cost = jax.lax.stop_gradient(cost)
  reg = ot.NegEntropy(opts.epsilon)
  fixed = jax.lax.stop_gradient(cost)
  if opts.solver == "lbfgs":
    alpha = jax.vmap(lambda c, a, b: _lbfgs_potentials(c, a, b, opts))(fixed, tokens, experts)
    if not differentiable:
      return jax.vmap(lambda al, b, c: ot.plan_from_semi_dual(al, b, c, reg))(
          alpha, experts, cost)
    return jax.vmap(implicit.semi_dual_plan, in_axes=(0, 0, 0, 0, None))(
        alpha, tokens, experts, cost, reg)
  if not (differentiable and opts.implicit_differentiation):
    return sbase.entropic_plans(cost, tokens, experts, opts.epsilon, opts.num_iters, "experts")
  # Experts are the rows of the transposed problem; the last (token) update is the
  # semi-dual plan of the expert potentials.
  alpha = jax.vmap(lambda c, a, b: _sinkhorn_potentials(c, a, b, opts))(fixed, tokens, experts)
  plan_t = jax.vmap(implicit.semi_dual_plan, in_axes=(0, 0, 0, 0, None))(
      alpha, experts, tokens, jnp.swapaxes(cost, 1, 2), reg)
  return jnp.swapaxes(plan_t, 1, 2)


def route(logits: Array, token_mask: Array, opts: KLOTOptions, capacity: int, train: bool,
          rng: Optional[Array]) -> rt.Routing:
  e = logits.shape[-1]
  std = base.gate_noise_std(opts.noise_std, e)
  noisy = train and std > 0
  noisy_logits = logits + std * jax.random.normal(rng, logits.shape, logits.dtype) \
      if noisy else logits
  by_plan = opts.combine_weights == "plan"
  plan = plans(noisy_logits, token_mask, opts, differentiable=by_plan)
  if opts.form == "expert_choice":
    token_index, valid = rt.assign_expert_choice(jax.lax.stop_gradient(plan), token_mask,
                                                 capacity)
    softmax = jax.nn.softmax(noisy_logits, axis=-1)
  else:
    k = min(opts.num_selected_experts, e)
    token_index, valid = base.assign_top_k(plan, token_mask, e, k, capacity,
                                           opts.batch_priority)
    softmax = jax.nn.softmax(logits, axis=-1)   # The clean logits' (module docstring).
  gates = plan if by_plan else softmax
  aux, extra = base.zero_loss(), {}
  if opts.importance_loss_weight > 0:
    imp = topk.importance_loss(jax.nn.softmax(logits, axis=-1), token_mask)
    aux = aux + opts.importance_loss_weight * imp
    extra["importance_loss"] = jax.lax.stop_gradient(imp)
  if noisy and opts.load_loss_weight > 0:
    k = min(opts.num_selected_experts, e)
    load = topk.load_loss(logits, noisy_logits, std, k, token_mask)
    aux = aux + opts.load_loss_weight * load
    extra["load_loss"] = jax.lax.stop_gradient(load)
  return base.finish(gates, token_index, valid, aux, extra)


def needs_rng(opts: KLOTOptions, train: bool) -> bool:
  return train and base.gate_noise_std(opts.noise_std, 1) > 0


ROUTER = base.Router(name="kl_ot", options=KLOTOptions, route=route, capacity=capacity,
                     needs_rng=needs_rng)
