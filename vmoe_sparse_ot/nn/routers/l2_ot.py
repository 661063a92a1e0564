"""'l2_ot': squared-L2 OT routing without the cardinality constraint (expert choice).

Per group, the quadratically regularized OT plan (Blondel et al. 2018) of cost
-softmax(logits), mass 1 per real token and (real tokens)/E per expert,
strength gamma: min_T <T, C> + gamma/2 ||T||^2, i.e. the Euclidean projection
of softmax(logits) / gamma onto the transportation polytope. Its plan is sparse
but with no bound on a column's nonzeros. It is found as the reference's
squared-L2 router finds it: `num_steps` Adam steps (learning rate
`learning_rate`) on the semi-dual from alpha = 0 (`ot.solve` with `SquaredL2`,
vmapped over groups). Each expert then takes the top-C tokens of its plan column
(C as `expert_choice`: S / E, no K), only tokens in the plan's support unless
`dispatch_zeros`. Combine weights: softmax(logits) at the dispatched pairs, or
the plan's entries (`combine_weights='plan'`), differentiated implicitly through
the solve (`implicit_differentiation`, `nn.routers.implicit`) or through the
unrolled Adam steps. No noise, no auxiliary loss (as the reference's).
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
from vmoe_sparse_ot.nn.routers import sparse_ot

Array = jax.Array
# Padding tokens' cost: far above every real token's (-1 <= cost <= 0), so that
# their potential never brings them into a column's support.
_PAD_COST = 100.0


@dataclasses.dataclass(frozen=True)
class L2OTOptions(base.CommonOptions):
  num_steps: int = base.option(
      20, "Adam steps on the semi-dual (the reference's maxiter, 20 by default there).",
      check=base.AT_LEAST_ONE)
  learning_rate: float = base.option(1e-2, "Adam step size (the reference's adam_lr).",
                                     check=base.POSITIVE)
  gamma: float = base.option(1.0, "Squared-L2 regularization strength.", check=base.POSITIVE)
  combine_weights: str = base.option(
      "softmax", "'softmax' (of the logits) or 'plan' (its entries, with a gradient), as "
      "the reference's use_softmax_combine_weights True / False.",
      choices=sparse_ot.COMBINE_WEIGHTS)
  dispatch_zeros: bool = base.option(
      False, "True: each expert's top-C tokens by plan value take slots even where the "
      "plan is 0 (ties to the lower index), as the reference's dispatcher; False: only "
      "the plan's support.")
  implicit_differentiation: bool = base.option(
      True, "Plan combine weights: gradients by implicit differentiation through the "
      "solve (the reference's); False: through the unrolled Adam steps.")


def problems(logits: Array, token_mask: Array):
  """(cost (G, S, E), token masses (G, S), expert masses (G, E)) of (G, S, E) logits."""
  e = logits.shape[-1]
  mask = jnp.asarray(token_mask, jnp.float32)
  cost = jnp.where(token_mask[..., None],
                   -jax.nn.softmax(logits.astype(jnp.float32), axis=-1), _PAD_COST)
  experts = jnp.broadcast_to(jnp.sum(mask, axis=1, keepdims=True) / e, mask.shape[:1] + (e,))
  return cost, mask, experts


def _adam(cost: Array, a: Array, b: Array, opts: L2OTOptions) -> ot.OTResult:
  return ot.solve(a, b, cost, ot.SquaredL2(opts.gamma), formulation="semi_dual",
                  solver=ot.Adam(learning_rate=opts.learning_rate), max_iter=opts.num_steps,
                  tol=0.0, init=jnp.zeros_like(a))


def plans(logits: Array, token_mask: Array, opts: L2OTOptions,
          differentiable: bool = True) -> Array:
  """(G, S, E) plans of (G, S, E) logits; differentiable in the logits as the options
  say, or (not `differentiable`) with no gradient."""
  cost, a, b = problems(logits, token_mask)
  if not differentiable:
    cost = jax.lax.stop_gradient(cost)
  if not differentiable:
    return jax.vmap(lambda c, a, b: _adam(c, a, b, opts).plan)(cost, a, b)
  if not opts.implicit_differentiation:
    # The same Adam iterates, differentiable through its unrolled steps: the
    # k-sparse semi-dual with k = S, where the constraint binds nowhere.
    return ot.batched_semi_dual_adam(cost, a, b, cost.shape[1], opts.gamma, opts.num_steps,
                                     opts.learning_rate)
  reg = ot.SquaredL2(opts.gamma)
  alpha = jax.vmap(lambda c, a, b: _adam(c, a, b, opts).alpha)(
      jax.lax.stop_gradient(cost), a, b)
  return jax.vmap(lambda al, a, b, c: implicit.semi_dual_plan(al, a, b, c, reg))(
      alpha, a, b, cost)


def route(logits: Array, token_mask: Array, opts: L2OTOptions, capacity: int, train: bool,
          rng: Optional[Array]) -> rt.Routing:
  del train, rng
  by_plan = opts.combine_weights == "plan"
  plan = plans(logits, token_mask, opts, differentiable=by_plan)
  gates = plan if by_plan else jax.nn.softmax(logits, axis=-1)
  min_score = None if opts.dispatch_zeros else 0.0
  token_index, valid = rt.assign_expert_choice(jax.lax.stop_gradient(plan), token_mask,
                                               capacity, min_score=min_score)
  return base.finish(gates, token_index, valid, base.zero_loss())


ROUTER = base.Router(name="l2_ot", options=L2OTOptions, route=route,
                     capacity=expert_choice.capacity)
