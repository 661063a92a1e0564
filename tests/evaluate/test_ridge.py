"""Closed-form ridge: agreement with a direct solve, LOO formula, L2 selection."""
import numpy as np
import pytest

from tests.evaluate.helpers import clusters
from vmoe_sparse_ot.evaluate import ridge

L2_REGS = tuple(2.0**k for k in range(-10, 20))


def _direct(x, y, lam):
  return np.linalg.solve(x.T @ x + lam * np.eye(x.shape[1]), x.T @ y)


@pytest.mark.parametrize('n,d', [(40, 6), (7, 12), (9, 8)])  # primal, kernel, square+bias
def test_closed_form_matches_direct_solve_for_every_l2(n, d):
  rng = np.random.default_rng(0)
  feats = rng.normal(size=(n, d)) * rng.uniform(0.1, 5.0, size=d) + 3.0
  labels = rng.integers(0, 3, size=n)
  mean, scale = ridge.standardization(feats)
  x = ridge.design_matrix(feats, mean, scale)
  y = ridge.one_hot_pm1(labels, 3)
  path = ridge.ridge_weights_path(x, y, L2_REGS)
  assert path.shape == (len(L2_REGS), d + 1, 3)
  for lam, w in zip(L2_REGS, path):
    np.testing.assert_allclose(w, _direct(x, y, lam), rtol=1e-7, atol=1e-10)


def test_design_matrix_standardises_and_appends_bias():
  feats = np.array([[1.0, 5.0], [3.0, 5.0], [5.0, 5.0]])
  mean, scale = ridge.standardization(feats)
  np.testing.assert_allclose(mean, [3.0, 5.0])
  np.testing.assert_allclose(scale, [np.sqrt(8 / 3), 1.0])  # constant feature keeps 1
  x = ridge.design_matrix(feats, mean, scale)
  np.testing.assert_allclose(x[:, 0], np.array([-2.0, 0.0, 2.0]) / np.sqrt(8 / 3))
  np.testing.assert_allclose(x[:, 1:], [[0.0, 1.0]] * 3)
  np.testing.assert_array_equal(ridge.one_hot_pm1(np.array([2, 0]), 3),
                                [[-1, -1, 1], [1, -1, -1]])


@pytest.mark.parametrize('n,p', [(12, 4), (5, 9)])
def test_loo_predictions_match_refitting_without_each_example(n, p):
  rng = np.random.default_rng(1)
  x = rng.normal(size=(n, p))
  y = rng.normal(size=(n, 2))
  l2_regs = (2.0**-10, 1.0, 2.0**10)
  for lam, loo in zip(l2_regs, ridge.loo_predictions(ridge.spectrum(x), y, l2_regs)):
    for i in range(n):
      keep = np.arange(n) != i
      np.testing.assert_allclose(loo[i], x[i] @ _direct(x[keep], y[keep], lam),
                                 rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize('selection', ridge.SELECTION_MODES)
@pytest.mark.parametrize('shot', [1, 5])
def test_separable_features_are_classified_perfectly(selection, shot):
  train_x, train_y = clusters(2, 10, shot)
  test_x, test_y = clusters(3, 10, 50)
  fit = ridge.fit(train_x, train_y, num_classes=10, l2_regs=L2_REGS, selection=selection)
  assert fit.l2_reg in L2_REGS
  accuracy = np.mean(np.argmax(fit.predict(test_x), axis=1) == test_y)
  assert accuracy >= 0.99


def test_selection_uses_accuracy_then_mse_then_larger_l2():
  l2 = np.array([1.0, 2.0, 4.0, 8.0])
  assert ridge._choose(l2, np.array([0.5, 0.9, 0.9, 0.2]), np.array([1, 3, 2, 0.]), True) == 2
  assert ridge._choose(l2, np.array([0.5, 0.9, 0.9, 0.2]), np.array([1, 2, 2, 0.]), True) == 2
  assert ridge._choose(l2, np.full(4, np.nan), np.array([3, 1, 2, 1.]), False) == 3


def test_one_shot_selects_by_loo_mse_and_flags_no_accuracy():
  x, y = clusters(3, 4, 1)
  fit = ridge.fit(x, y, num_classes=4, l2_regs=L2_REGS, selection='holdout')
  assert np.all(np.isnan(fit.selection_accuracy))
  assert fit.l2_reg == L2_REGS[int(np.argmin(fit.selection_mse))]


def test_fit_weights_are_refitted_on_all_examples_at_chosen_l2():
  x, y = clusters(4, 3, 6, dim=5, noise=1.0)
  for selection in ridge.SELECTION_MODES:
    fit = ridge.fit(x, y, num_classes=3, l2_regs=L2_REGS, selection=selection, seed=7)
    design = ridge.design_matrix(x, *ridge.standardization(x))
    np.testing.assert_allclose(
        fit.weights, _direct(design, ridge.one_hot_pm1(y, 3), fit.l2_reg), rtol=1e-7, atol=1e-10)


def test_holdout_split_is_stratified():
  labels = np.repeat(np.arange(3), [2, 5, 10])
  held = ridge._holdout_split(labels, 0.2, np.random.default_rng(0))
  np.testing.assert_array_equal(np.bincount(labels[held]), [1, 1, 2])


@pytest.mark.parametrize('kwargs,match', [
    ({'selection': 'test'}, 'selection'),
    ({'holdout_fraction': 1.0}, 'holdout_fraction'),
    ({'l2_regs': (1.0, -1.0)}, 'l2_regs'),
    ({'num_classes': 2}, 'labels'),
])
def test_bad_arguments_raise(kwargs, match):
  args = {'num_classes': 3, 'l2_regs': L2_REGS, **kwargs}
  with pytest.raises(ValueError, match=match):
    ridge.fit(np.zeros((3, 2)), np.array([0, 1, 2]), **args)


def test_reference_l2_index_by_hand():
  # Ranks (0: worst; equal accuracies in grid order): [0, 2, 3, 1] and [3, 1, 2, 0];
  # mean [1.5, 1.5, 2.5, 0.5]: index 2.
  assert ridge.reference_l2_index([[0.5, 0.7, 0.7, 0.6], [0.9, 0.8, 0.8, 0.1]]) == 2
  # Equal mean ranks: the first.
  assert ridge.reference_l2_index([[0.1, 0.9], [0.9, 0.1]]) == 0
  assert ridge.reference_l2_index([[0.3, 0.3, 0.3]]) == 2


@pytest.mark.parametrize('per_class, dim', [(6, 4), (2, 9)])   # n >= p and p > n
def test_fit_each_reference_design_is_the_reference_evaluators_formula(per_class, dim):
  """design='reference' against the reference V-MoE few-shot evaluator's computation,
  written out: features centred, divided by std + 1e-5 (a constant feature too), a
  bias column of 100, targets 2 one_hot - 1; eigh of X^T X (n >= p) or X X^T, and
  W = lhs diag(1 / (eigs + l2)) rhs."""
  x, y = clusters(4, num_classes=3, per_class=per_class, dim=dim, noise=1.0)
  x[:, 0] = 2.5                                   # a constant feature: std 0 there
  test_x = clusters(5, num_classes=3, per_class=3, dim=dim, noise=1.0)[0]
  l2_regs = (2.0**-10, 0.5, 64.0)
  mean, std = x.mean(0, keepdims=True), x.std(0, keepdims=True) + 1e-5
  design = np.pad((x - mean) / std, ((0, 0), (0, 1)), constant_values=100.0)
  targets = 2.0 * np.eye(3)[y] - 1.0
  if design.shape[0] >= design.shape[1]:
    eigs, q = np.linalg.eigh(design.T @ design)
    rhs, lhs = q.T @ (design.T @ targets), q
  else:
    eigs, q = np.linalg.eigh(design @ design.T)
    rhs, lhs = q.T @ targets, design.T @ q
  test_design = np.pad((test_x - mean) / std, ((0, 0), (0, 1)), constant_values=100.0)
  fits = ridge.fit_each(x, y, num_classes=3, l2_regs=l2_regs, design='reference')
  for lam, fit in zip(l2_regs, fits):
    want = (lhs / (eigs + lam)[None, :]) @ rhs
    np.testing.assert_allclose(fit.weights, want, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(fit.predict(test_x), test_design @ want, rtol=1e-6, atol=1e-8)
  # Ours differs: a bias column of 1 (and a constant feature left at 0).
  ours = ridge.fit_each(x, y, num_classes=3, l2_regs=l2_regs)
  assert not np.allclose(ours[-1].weights[-1], fits[-1].weights[-1])
  with pytest.raises(ValueError, match="design must be one of"):
    ridge.fit_each(x, y, num_classes=3, l2_regs=l2_regs, design='vmoe')


def test_fit_each_is_fit_at_each_strength():
  x, y = clusters(3, num_classes=3, per_class=4, dim=5, noise=1.0)
  l2_regs = (0.01, 1.0, 100.0)
  for lam, each in zip(l2_regs, ridge.fit_each(x, y, num_classes=3, l2_regs=l2_regs)):
    alone = ridge.fit(x, y, num_classes=3, l2_regs=(lam,))
    assert each.l2_reg == lam
    np.testing.assert_allclose(each.weights, alone.weights, rtol=1e-9, atol=1e-12)
