"""The paper's five V-MoE routers, as translated from reference configs, against the
reference's formulas written out in numpy (float64) on the same logits.

For each router: its plan, the (token, expert) pairs its dispatcher sends, and the
combine weights at them, against a numpy rendering of the reference's computation:
- k-sparse (both forms) and squared-L2: Adam (optax's constants) on the semi-dual
  from alpha = 0, cost -softmax(logits), columns t_j = b_j P(x / b_j) with P the
  (k-sparse) projection onto the simplex, maxiter steps at adam_lr;
- KL: scaling-form Sinkhorn on exp(logits), the expert side first, maxiter
  iterations (OTT's kernel mode); with use_lbfgs, the converged entropic plan (the
  reference's jaxopt L-BFGS stops at ||grad|| <= 1e-3, ours at max |grad| <= 1e-3);
- dispatch: the reference's einsum dispatchers: each expert's top-C tokens by plan
  (zeros included), or each token's top-K experts in rank-major order, position
  priority, within C; combine weights softmax(logits) (the KL token-choice router's:
  the clean logits) or the plan.

    PYTHONPATH=. .venv/bin/python benchmarks/reference_routers.py
"""
import numpy as np
import jax

from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn import routing as rt

G, S, E, K = 4, 64, 8, 2


def softmax(x):
  x = np.exp(x - x.max(-1, keepdims=True))
  return x / x.sum(-1, keepdims=True)


def simplex(x, k):
  """Projection of x (m,) onto the unit simplex among its k largest entries (0 elsewhere)."""
  top = np.argsort(-x, kind='stable')[:k]
  u = np.sort(x[top])[::-1]
  css = np.cumsum(u) - 1.0
  rho = np.nonzero(u - css / np.arange(1, len(u) + 1) > 0)[0][-1]
  out = np.zeros_like(x)
  out[top] = np.maximum(x[top] - css[rho] / (rho + 1), 0)
  return out


def semi_dual_adam(cost, a, b, k, steps, lr):
  """The reference's semi-dual solve: Adam from 0 on alpha (m,); plan (m, n)."""
  def plan(alpha):
    return np.stack([b[j] * simplex((alpha - cost[:, j]) / b[j], k)
                     for j in range(cost.shape[1])], 1)
  alpha, m, v = (np.zeros(cost.shape[0]) for _ in range(3))
  for t in range(1, steps + 1):
    g = a - plan(alpha).sum(1)
    m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
    alpha = alpha + lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
  return plan(alpha)


def sinkhorn(logits, iters):
  kernel = np.exp(logits)
  a, b = np.ones(S), np.full(E, S / E)
  u, v = np.ones(S), np.ones(E)
  for _ in range(iters):
    v = b / (kernel.T @ u)
    u = a / (kernel @ v)
  return u[:, None] * kernel * v[None, :]


def top_items_per_expert(plan, c):
  """(S, E) bool: each expert's top-c tokens by plan, ties to the lower index."""
  out = np.zeros(plan.shape, bool)
  for e in range(E):
    out[np.argsort(-plan[:, e], kind='stable')[:c], e] = True
  return out


def top_experts_per_item(plan, k, c):
  out, fill = np.zeros(plan.shape, bool), np.zeros(E, int)
  choice = np.argsort(-plan, axis=1, kind='stable')[:, :k]
  for rank in range(k):
    for s in range(S):
      e = choice[s, rank]
      if fill[e] < c:
        out[s, e] = True
      fill[e] += 1
  return out


def reference(name, logits):
  """(plan, dispatched (S, E), combine (S, E)) of one group, by the reference's formulas."""
  gates = softmax(logits)
  c_ec, c_tc = 8, 16                              # ceil(S / E), ceil(S K / E): multiples of 4
  if name == 'ksparse_ec':
    plan = semi_dual_adam(-gates, np.ones(S), np.full(E, S / E), c_ec, 20, 1e-2)
    sent = top_items_per_expert(plan, c_ec)
  elif name == 'ksparse_tc':
    plan = semi_dual_adam(-gates.T, np.full(E, S / E), np.ones(S), K, 20, 1e-2).T
    sent = top_experts_per_item(plan, K, c_tc)
  elif name == 'l2':
    plan = semi_dual_adam(-gates, np.ones(S), np.full(E, S / E), S, 20, 1e-2)
    sent = top_items_per_expert(plan, c_ec)
  elif name in ('kl_tc', 'kl_ec'):
    plan = sinkhorn(logits, 20)
    sent = (top_experts_per_item(plan, K, c_tc) if name == 'kl_tc'
            else top_items_per_expert(plan, c_ec))
  else:                                           # kl_tc with use_lbfgs: the optimum
    plan = sinkhorn(logits, 5000)
    sent = top_experts_per_item(plan, K, c_tc)
  return plan, sent, np.where(sent, gates, 0.0)


OURS = {
    'ksparse_ec': {'name': 'sparse_ot', 'num_selected_experts': 1, 'sparse_ot': {
        'form': 'expert_choice', 'solver': 'adam', 'num_steps': 20, 'dispatch_zeros': True}},
    'ksparse_tc': {'name': 'sparse_ot', 'num_selected_experts': K, 'sparse_ot': {
        'form': 'token_choice', 'solver': 'adam', 'num_steps': 20, 'dispatch_zeros': True}},
    'l2': {'name': 'l2_ot', 'l2_ot': {'dispatch_zeros': True}},
    'kl_tc': {'name': 'kl_ot', 'num_selected_experts': K},
    'kl_tc_lbfgs': {'name': 'kl_ot', 'num_selected_experts': K,
                    'kl_ot': {'solver': 'lbfgs', 'num_iters': 100}},
    'kl_ec': {'name': 'kl_ot', 'kl_ot': {'form': 'expert_choice'}},
}


def ours(key, logits):
  cfg = routers.parse_router_options({'capacity_factor': 1.0, **OURS[key]})
  router = routers.get_router(cfg.name)
  capacity = router.capacity(cfg.options, S, E)
  mask = np.ones((G, S), bool)
  plan_fn = {'sparse_ot': lambda: router_module(cfg).plans(logits, mask, cfg.options, capacity),
             'l2_ot': lambda: router_module(cfg).plans(logits, mask, cfg.options, False),
             'kl_ot': lambda: router_module(cfg).plans(logits, mask, cfg.options, False)}
  plan = np.asarray(jax.jit(plan_fn[cfg.name])())
  r = jax.jit(lambda x: routers.route(x, mask, cfg, capacity, False))(logits)
  combine = np.asarray(rt.expert_weights(r, group_size=S))
  return plan, combine > 0, combine, capacity


def router_module(cfg):
  return {'sparse_ot': routers.sparse_ot, 'l2_ot': routers.l2_ot, 'kl_ot': routers.kl_ot}[cfg.name]


def main():
  print('| router | scale | C | max abs plan diff | pairs dispatched alike | '
        'max abs combine diff |')
  print('|---|---:|---:|---:|---:|---:|')
  for scale in (1.0, 4.0):
    logits = (scale * np.random.default_rng(0).standard_normal((G, S, E))).astype(np.float32)
    for key in OURS:
      plan, sent, combine, c = ours(key, logits)
      want = [reference(key, logits[g].astype(np.float64)) for g in range(G)]
      plan_diff = max(np.abs(plan[g] - want[g][0]).max() for g in range(G))
      # Pairs dispatched alike: ours (nonzero combine weight) against the reference's
      # dispatcher; softmax weights are nonzero wherever a pair is sent.
      alike = np.mean([np.mean((combine[g] > 0) == want[g][1]) for g in range(G)])
      comb = max(np.abs(combine[g] - want[g][2]).max() for g in range(G))
      print(f'| {key} | {scale:g} | {c} | {plan_diff:.1e} | {alike:.4f} | {comb:.1e} |')


if __name__ == '__main__':
  main()
