"""Paper Figure 1: OT plans between 2D point clouds across formulations.

20 source points from N(0, I) and 20 target points from N((4, 4), Sigma); the
cost is the Euclidean distance (as the paper's appendix says; the figure's
caption says squared Euclidean), the marginals are uniform (1/20 each). The
paper's appendix gives Sigma = [[1, -0.8], [-0.6, 1]], which is not symmetric
and so not a covariance; we use its symmetric part [[1, -0.7], [-0.7, 1]]
(eigenvalues 0.3 and 1.7), the valid covariance closest to it in Frobenius norm.

Plans: unregularized OT (POT's network simplex `ot.emd`), entropic (the
project's Sinkhorn, epsilon = 0.1), squared 2-norm (gamma = 1) and
sparsity-constrained (gamma = 1) with k = 1, 2, 3 (semi-dual, L-BFGS). Top
row: a segment per nonzero of the plan; bottom row: the plan matrix. Each
panel is labelled with its number of nonzeros.

Checks kept in the JSON: nonzeros per plan and the largest per column, and the
limit case k = 1 (the paper's Proposition 4, limit cases): the semi-dual optimum equals the
unregularized cost plus gamma/2 ||b||^2, and the k = 1 plan is an unregularized
optimal plan (its cost <T, C> equals emd's).
"""
import os

import jax
import numpy as np

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.experiments import common, style

NAME = 'formulations_2d'
NUM_POINTS = 20
COVARIANCE_PAPER = [[1.0, -0.8], [-0.6, 1.0]]
COVARIANCE = [[1.0, -0.7], [-0.7, 1.0]]  # symmetric part of the paper's matrix
GAMMA = 1.0
EPSILON = 0.1
KS = (1, 2, 3)


def problem(seed: int = 0):
  """(X (m, 2), Y (n, 2), a (m,), b (n,), C (m, n)) of the figure, float64.

  Points are ordered by x - y (the direction across the transport)."""
  rng = np.random.default_rng(seed)
  X = rng.multivariate_normal([0.0, 0.0], np.eye(2), NUM_POINTS)
  Y = rng.multivariate_normal([4.0, 4.0], COVARIANCE, NUM_POINTS)
  # Order both clouds along (1, -1), across the transport direction, so that the
  # plan matrices read roughly as diagonals.
  X = X[np.argsort(X[:, 0] - X[:, 1])]
  Y = Y[np.argsort(Y[:, 0] - Y[:, 1])]
  C = np.sqrt(((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1))
  a = np.full(NUM_POINTS, 1.0 / NUM_POINTS)
  b = np.full(NUM_POINTS, 1.0 / NUM_POINTS)
  return X, Y, a, b, C


def run(out_dir: str, *, quick: bool, seeds: int | None) -> dict:
  del quick  # the full run already takes seconds
  del seeds  # one seeded draw, as in the paper's figure
  seed = 0
  X, Y, a, b, C = problem(seed)
  with common.quiet_stdout():
    T0 = common.pot().emd(a, b, C)
  emd_cost = float(np.sum(T0 * C))
  plans = {'unregularized': T0}
  labels = {'unregularized': 'Unregularized'}
  extra = {}
  with jax.enable_x64(True):
    plans['entropic'] = np.asarray(common.sinkhorn_plan(a, b, C, EPSILON).plan)
    labels['entropic'] = f'Entropic (ε={EPSILON:g})'
    res = common.solve_plan(a, b, C, ot.SquaredL2(GAMMA))
    plans['squared_l2'] = np.asarray(res.plan)
    labels['squared_l2'] = f'Squared 2-norm (γ={GAMMA:g})'
    for k in KS:
      res = common.solve_plan(a, b, C, ot.SparsityConstrained(k=k, gamma=GAMMA))
      key = f'sparsity_constrained_k{k}'
      plans[key] = np.asarray(res.plan)
      labels[key] = f'Sparsity-constr. k={k}'
      extra[key] = {'semi_dual_value': float(res.value),
                    'max_marginal_violation': float(res.grad_norm)}

  fig, axes = style.figure(2, len(plans), width=2.1 * len(plans), height=4.6,
                           title='OT formulations between 2D point clouds '
                                 f'(m = n = {NUM_POINTS}, Euclidean cost, uniform marginals)')
  for col, (key, T) in enumerate(plans.items()):
    style.matching(axes[0, col], X, Y, T, title=labels[key])
    style.plan_matrix(axes[1, col], T)
  axes[0, 0].legend(loc='lower right', frameon=False, handletextpad=0.1)
  fig.text(0.5, -0.02, 'Target covariance [[1, -0.7], [-0.7, 1]]: the symmetric part of '
           "the paper's non-symmetric [[1, -0.8], [-0.6, 1]].", ha='center', fontsize=8,
           color='0.3')
  path = style.save(fig, os.path.join(out_dir, f'{NAME}.png'))

  summary = {}
  for key, T in plans.items():
    summary[key] = {'nonzeros': style.nnz(T), 'max_nonzeros_per_column': common.max_col_nnz(T),
                    'min_entry': float(T.min()), 'transport_cost': float(np.sum(T * C)),
                    **extra.get(key, {})}
  T1 = plans['sparsity_constrained_k1']
  return {
      'figure': path,
      'seed': seed,
      'covariance_paper': COVARIANCE_PAPER,
      'covariance_used': COVARIANCE,
      'covariance_note': "the paper's matrix is not symmetric; we use its symmetric part",
      'gamma': GAMMA,
      'epsilon': EPSILON,
      'ks': list(KS),
      'plans': summary,
      'limit_k1': {
          'emd_cost': emd_cost,
          'expected_value': emd_cost + 0.5 * GAMMA * float(np.sum(b ** 2)),
          'semi_dual_value': extra['sparsity_constrained_k1']['semi_dual_value'],
          'plan_cost': float(np.sum(T1 * C)),
          'plan_regularized_cost': float(np.sum(T1 * C) + 0.5 * GAMMA * np.sum(T1 ** 2)),
      },
  }


def format_table(payload: dict) -> str:
  rows = [('plan', 'nonzeros', 'max per column', '<T, C>')]
  for key, p in payload['plans'].items():
    rows.append((key, p['nonzeros'], p['max_nonzeros_per_column'], f"{p['transport_cost']:.6f}"))
  lim = payload['limit_k1']
  return common.format_rows(rows, title=f"{NAME}: gamma = {payload['gamma']}, entropic epsilon "
                            f"= {payload['epsilon']}") + (
      f"\nk = 1 limit: semi-dual value {lim['semi_dual_value']:.10f}, emd cost + gamma/2 ||b||^2 "
      f"= {lim['expected_value']:.10f}")
