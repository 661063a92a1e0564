"""Routers, looked up by name: logits (G, S, E) -> `Routing`.

- 'topk': V-MoE TopK (Riquelme et al. 2021). Softmax of noisy logits (noise std
  1/E by default, in training only), top-K experts per token, buffer slots in
  priority order, importance + load auxiliary losses.
- 'sbase': Sinkhorn-BASE (Clark et al. 2022). Entropic OT with cost -logits,
  mass 1 per token and S/E per expert; top-K of the plan per token, slots as in
  TopK; combine weights softmax(logits).
- 'sparse_ot': the paper's router. Sparsity-constrained OT with cost
  -softmax(logits), mass 1 per token and S/E per expert, at most k = C nonzeros
  per expert column (semi-dual, Adam or L-BFGS); each expert takes the tokens in
  the support of its column. Form 'token_choice' transposes the problem: at most
  K experts per token, slots as in TopK.
- 'expert_choice': each expert takes its top-C tokens by softmax gate (Zhou et
  al. 2022).
No gradient flows through the assignment (top-k, Sinkhorn, OT solver); the
router learns through the combine weights, softmax(logits) at the dispatched
(token, expert) pairs.
"""
import dataclasses
from typing import Any, Callable, Dict, Mapping, Optional

import jax
import jax.numpy as jnp

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.nn import routing as rt

Array = jax.Array

# Keys each router reads; everything in `nn.config.default_router_config()`.
COMMON_KEYS = ("name", "num_selected_experts", "capacity_factor", "capacity",
               "noise_std", "batch_priority", "importance_loss_weight",
               "load_loss_weight", "sbase", "sparse_ot")
SBASE_KEYS = ("epsilon", "num_iters")
SPARSE_OT_KEYS = ("form", "solver", "num_steps", "learning_rate", "gamma", "implementation")
SPARSE_OT_FORMS = ("expert_choice", "token_choice")
SPARSE_OT_SOLVERS = ("adam", "lbfgs")
SPARSE_OT_IMPLEMENTATIONS = ("fast", "reference")


@dataclasses.dataclass(frozen=True)
class RouterOptions:
  """Validated, hashable router options (parsed from the config once)."""
  name: str = "topk"
  num_selected_experts: int = 2
  capacity_factor: float = 1.0
  capacity: Optional[int] = None
  noise_std: Optional[float] = None
  batch_priority: bool = False
  importance_loss_weight: float = 0.005
  load_loss_weight: float = 0.005
  sbase_epsilon: float = 1.0
  sbase_num_iters: int = 20
  sparse_ot_form: str = "expert_choice"
  sparse_ot_solver: str = "adam"
  sparse_ot_num_steps: int = 50
  sparse_ot_learning_rate: float = 1e-2
  sparse_ot_gamma: float = 1.0
  sparse_ot_implementation: str = "fast"


def check_keys(cfg: Mapping[str, Any], valid, where: str) -> None:
  """Raises ValueError naming unknown keys of `cfg` (at config path `where`) and the valid ones."""
  unknown = sorted(set(cfg.keys()) - set(valid))
  if unknown:
    raise ValueError(f"unknown option(s) {unknown} in {where}; valid options: {sorted(valid)}")


def parse_router_options(cfg: Mapping[str, Any]) -> RouterOptions:
  """Validates a router config dict (see `nn.config.default_router_config`)."""
  cfg = dict(cfg)
  check_keys(cfg, COMMON_KEYS, "model.encoder.moe.router")
  name = cfg.get("name", "topk")
  if name not in ROUTERS:
    raise ValueError(f"model.encoder.moe.router.name must be one of {sorted(ROUTERS)}, "
                     f"got {name!r}")
  sbase = dict(cfg.get("sbase", {}) or {})
  check_keys(sbase, SBASE_KEYS, "model.encoder.moe.router.sbase")
  sot = dict(cfg.get("sparse_ot", {}) or {})
  check_keys(sot, SPARSE_OT_KEYS, "model.encoder.moe.router.sparse_ot")
  d = RouterOptions()
  opts = RouterOptions(
      name=name,
      num_selected_experts=int(cfg.get("num_selected_experts", d.num_selected_experts)),
      capacity_factor=float(cfg.get("capacity_factor", d.capacity_factor)),
      capacity=None if cfg.get("capacity") is None else int(cfg["capacity"]),
      noise_std=None if cfg.get("noise_std") is None else float(cfg["noise_std"]),
      batch_priority=bool(cfg.get("batch_priority", d.batch_priority)),
      importance_loss_weight=float(cfg.get("importance_loss_weight",
                                           d.importance_loss_weight)),
      load_loss_weight=float(cfg.get("load_loss_weight", d.load_loss_weight)),
      sbase_epsilon=float(sbase.get("epsilon", d.sbase_epsilon)),
      sbase_num_iters=int(sbase.get("num_iters", d.sbase_num_iters)),
      sparse_ot_form=sot.get("form", d.sparse_ot_form),
      sparse_ot_solver=sot.get("solver", d.sparse_ot_solver),
      sparse_ot_num_steps=int(sot.get("num_steps", d.sparse_ot_num_steps)),
      sparse_ot_learning_rate=float(sot.get("learning_rate", d.sparse_ot_learning_rate)),
      sparse_ot_gamma=float(sot.get("gamma", d.sparse_ot_gamma)),
      sparse_ot_implementation=sot.get("implementation", d.sparse_ot_implementation),
  )
  if opts.num_selected_experts < 1:
    raise ValueError(f"num_selected_experts must be >= 1, got {opts.num_selected_experts}")
  if opts.sparse_ot_form not in SPARSE_OT_FORMS:
    raise ValueError(f"model.encoder.moe.router.sparse_ot.form must be one of "
                     f"{list(SPARSE_OT_FORMS)}, got {opts.sparse_ot_form!r}")
  if opts.sparse_ot_solver not in SPARSE_OT_SOLVERS:
    raise ValueError(f"model.encoder.moe.router.sparse_ot.solver must be one of "
                     f"{list(SPARSE_OT_SOLVERS)}, got {opts.sparse_ot_solver!r}")
  if opts.sparse_ot_implementation not in SPARSE_OT_IMPLEMENTATIONS:
    raise ValueError(f"model.encoder.moe.router.sparse_ot.implementation must be one of "
                     f"{list(SPARSE_OT_IMPLEMENTATIONS)}, got {opts.sparse_ot_implementation!r}")
  if opts.sparse_ot_gamma <= 0 or opts.sparse_ot_learning_rate <= 0 or \
      opts.sparse_ot_num_steps < 1:
    raise ValueError("model.encoder.moe.router.sparse_ot: gamma and learning_rate must be "
                     "> 0 and num_steps >= 1, got "
                     f"{opts.sparse_ot_gamma}, {opts.sparse_ot_learning_rate}, "
                     f"{opts.sparse_ot_num_steps}")
  if opts.sbase_num_iters < 1:
    raise ValueError(f"model.encoder.moe.router.sbase.num_iters must be >= 1, "
                     f"got {opts.sbase_num_iters}")
  if opts.sbase_epsilon <= 0:
    raise ValueError(f"model.encoder.moe.router.sbase.epsilon must be > 0, "
                     f"got {opts.sbase_epsilon}")
  return opts


def _finish(gates: Array, token_index: Array, valid: Array, token_mask: Array,
            auxiliary_loss: Array, extra: Optional[Dict[str, Array]] = None) -> rt.Routing:
  token_index = jax.lax.stop_gradient(token_index)
  weight = rt.gather_gates(gates, token_index, valid)
  metrics = rt.routing_metrics(token_index, valid, token_mask, auxiliary_loss)
  metrics.update(extra or {})
  return rt.Routing(token_index, valid, weight, auxiliary_loss, metrics)


def _cv_squared(x: Array) -> Array:
  """Squared coefficient of variation over the last axis."""
  return (jnp.std(x, axis=-1) / jnp.maximum(jnp.mean(x, axis=-1), 1e-9)) ** 2


def importance_loss(gates: Array, token_mask: Array) -> Array:
  """V-MoE importance loss: CV^2 over experts of the summed gates."""
  importance = jnp.sum(gates * token_mask[..., None], axis=(0, 1))
  return _cv_squared(importance)


def load_loss(logits: Array, noisy_logits: Array, noise_std: float, k: int,
              token_mask: Array) -> Array:
  """V-MoE load loss: CV^2 over experts of P(expert is in the token's top-K)."""
  threshold = jax.lax.top_k(noisy_logits, k)[0][..., -1:]   # K-th largest noisy logit
  p = 1.0 - jax.scipy.stats.norm.cdf((threshold - logits) / noise_std)
  mask = token_mask[..., None].astype(p.dtype)
  load = jnp.sum(p * mask, axis=(0, 1)) / jnp.maximum(jnp.sum(mask), 1.0)
  return _cv_squared(load)


def route_topk(logits: Array, token_mask: Array, opts: RouterOptions, capacity: int,
               train: bool, rng: Optional[Array]) -> rt.Routing:
  e = logits.shape[-1]
  k = min(opts.num_selected_experts, e)
  noise_std = 1.0 / e if opts.noise_std is None else opts.noise_std
  noisy = logits
  if train and noise_std > 0:
    noisy = logits + noise_std * jax.random.normal(rng, logits.shape, logits.dtype)
  gates = jax.nn.softmax(noisy, axis=-1)
  top_gates, expert_index = jax.lax.top_k(jax.lax.stop_gradient(gates), k)
  priority = top_gates[..., 0] if opts.batch_priority else None
  token_index, valid = rt.assign_token_choice(expert_index, token_mask, e, capacity,
                                              priority)
  imp = importance_loss(gates, token_mask)
  extra = {"importance_loss": jax.lax.stop_gradient(imp)}
  aux = opts.importance_loss_weight * imp
  if noise_std > 0:
    load = load_loss(logits, jax.lax.stop_gradient(noisy), noise_std, k, token_mask)
    aux = aux + opts.load_loss_weight * load
    extra["load_loss"] = jax.lax.stop_gradient(load)
  return _finish(gates, token_index, valid, token_mask, aux, extra)


def route_expert_choice(logits: Array, token_mask: Array, opts: RouterOptions,
                        capacity: int, train: bool, rng: Optional[Array]) -> rt.Routing:
  del opts, train, rng
  gates = jax.nn.softmax(logits, axis=-1)
  token_index, valid = rt.assign_expert_choice(jax.lax.stop_gradient(gates), token_mask,
                                               capacity)
  return _finish(gates, token_index, valid, token_mask, jnp.zeros((), logits.dtype))


def _uniform_marginals(s: int, e: int, dtype):
  """a = 1 per token (S,), b = S/E per expert (E,)."""
  return jnp.ones((s,), dtype), jnp.full((e,), s / e, dtype)


def route_sbase(logits: Array, token_mask: Array, opts: RouterOptions, capacity: int,
                train: bool, rng: Optional[Array]) -> rt.Routing:
  del train, rng
  _, s, e = logits.shape
  k = min(opts.num_selected_experts, e)
  a, b = _uniform_marginals(s, e, jnp.float32)
  cost = -jax.lax.stop_gradient(logits).astype(jnp.float32)
  plan = jax.vmap(lambda c: ot.sinkhorn(a, b, c, opts.sbase_epsilon,
                                        max_iter=opts.sbase_num_iters, tol=0.0).plan)(cost)
  top_plan, expert_index = jax.lax.top_k(plan, k)
  priority = top_plan[..., 0] if opts.batch_priority else None
  token_index, valid = rt.assign_token_choice(expert_index, token_mask, e, capacity,
                                              priority)
  gates = jax.nn.softmax(logits, axis=-1)
  return _finish(gates, token_index, valid, token_mask, jnp.zeros((), logits.dtype))


_PAD_COST = 100.0


def sparse_ot_plan(cost: Array, a: Array, b: Array, k: int, opts: RouterOptions) -> Array:
  """Plan (m, n) of the sparsity-constrained semi-dual, <= k nonzeros per column."""
  kwargs = {"max_iter": opts.sparse_ot_num_steps, "tol": 0.0}
  if opts.sparse_ot_solver == "adam":
    kwargs["learning_rate"] = opts.sparse_ot_learning_rate
  res = ot.solve(a, b, cost, ot.SparsityConstrained(k=k, gamma=opts.sparse_ot_gamma),
                 formulation="semi_dual", solver=opts.sparse_ot_solver, **kwargs)
  return res.plan


def sparse_ot_plans(logits: Array, token_mask: Array, opts: RouterOptions,
                    capacity: int) -> Array:
  """The sparse_ot router's plans (G, S, E) (no gradient).

  Expert-choice form: at most k = C nonzeros per expert column; token-choice form:
  at most K nonzeros per token row (the transposed problem). Cost 1 - softmax: the
  paper's -softmax shifted by a constant (same plans, and non-negative as the OT
  library's contract asks). Padding tokens get no mass and a cost far above any
  real token's, so they never enter a column's top k.
  """
  e = logits.shape[-1]
  gates = jax.nn.softmax(jax.lax.stop_gradient(logits).astype(jnp.float32), axis=-1)
  mask = token_mask.astype(jnp.float32)
  cost = jnp.where(token_mask[..., None], 1.0 - gates, _PAD_COST)        # (G, S, E)
  a = mask                                                               # (G, S)
  b = jnp.broadcast_to(jnp.sum(mask, axis=1, keepdims=True) / e, mask.shape[:1] + (e,))
  if opts.sparse_ot_form == "expert_choice":
    return _solve_plans(cost, a, b, capacity, opts)
  # Rows are experts (mass S/E), columns tokens (mass 1), <= K nonzeros per token.
  k = min(opts.num_selected_experts, e)
  return jnp.swapaxes(_solve_plans(jnp.swapaxes(cost, 1, 2), b, a, k, opts), 1, 2)


def _solve_plans(cost: Array, a: Array, b: Array, k: int, opts: RouterOptions) -> Array:
  """(G, m, n) plans of G semi-duals, <= k nonzeros per column."""
  if opts.sparse_ot_solver == "adam" and opts.sparse_ot_implementation == "fast":
    return ot.batched_semi_dual_adam(cost, a, b, k, opts.sparse_ot_gamma,
                                     opts.sparse_ot_num_steps, opts.sparse_ot_learning_rate)
  return jax.vmap(lambda c, a, b: sparse_ot_plan(c, a, b, k, opts))(cost, a, b)


def route_sparse_ot(logits: Array, token_mask: Array, opts: RouterOptions, capacity: int,
                    train: bool, rng: Optional[Array]) -> rt.Routing:
  del train, rng
  e = logits.shape[-1]
  plan = sparse_ot_plans(logits, token_mask, opts, capacity)
  if opts.sparse_ot_form == "expert_choice":
    # Each expert takes the support of its column (<= C entries by construction).
    token_index, valid = rt.assign_expert_choice(plan, token_mask, capacity, min_score=0.0)
  else:
    k = min(opts.num_selected_experts, e)
    top_plan, expert_index = jax.lax.top_k(plan, k)
    priority = top_plan[..., 0] if opts.batch_priority else None
    token_index, valid = rt.assign_token_choice(expert_index, token_mask, e, capacity,
                                                priority, choice_mask=top_plan > 0)
  gates = jax.nn.softmax(logits, axis=-1)
  return _finish(gates, token_index, valid, token_mask, jnp.zeros((), logits.dtype))


RouteFn = Callable[..., rt.Routing]
ROUTERS: Dict[str, RouteFn] = {
    "topk": route_topk,
    "sbase": route_sbase,
    "sparse_ot": route_sparse_ot,
    "expert_choice": route_expert_choice,
}


def route(logits: Array, token_mask: Array, opts: RouterOptions, capacity: int,
          train: bool, rng: Optional[Array] = None) -> rt.Routing:
  """Routes the (G, S, E) logits with the router named in `opts`."""
  return ROUTERS[opts.name](logits, token_mask, opts, capacity, train, rng)
