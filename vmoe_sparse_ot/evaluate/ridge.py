"""Closed-form ridge regression for few-shot linear transfer, over a grid of L2 strengths.

Shapes: n training examples, p features (the bias column included), c classes,
L candidate L2 strengths, r = rank of the design matrix.

The model. Features are standardised with the mean and standard deviation of the
few-shot training set only (a constant feature keeps scale 1), a column of ones is
appended (the bias), and the targets are one-hot in {-1, +1}. For every L2
strength `lam` the weights are the ridge solution

    W(lam) = argmin_W ||X W - Y||^2 + lam ||W||^2 = (X^T X + lam I)^{-1} X^T Y,

the bias row penalised like every other row (as in big_vision's few-shot
evaluator; with centred features and balanced classes the bias does not change
the argmax anyway).

One eigendecomposition for the whole grid. The Gram matrix of the smaller side is
diagonalised once: X^T X (p x p) when p <= n, else the kernel X X^T (n x n). Either
gives the thin SVD X = U diag(sigma) V^T, after which every L2 strength costs only
matrix products: W(lam) = V diag(sigma / (sigma^2 + lam)) U^T Y.

Choosing the L2 strength without the test split (`fit(..., selection=...)`):
- 'loo' (default): leave-one-out on the few-shot training set, in closed form from
  the same decomposition. With the hat matrix H = U diag(sigma^2/(sigma^2+lam)) U^T,
  the prediction for example i from a fit without it is
  y_i - (y_i - yhat_i) / (1 - H_ii). The score is leave-one-out top-1 accuracy,
  ties broken by leave-one-out mean squared error, then by the larger L2.
  The standardisation statistics are those of the whole few-shot set (the held-out
  example included), which keeps the closed form exact for the ridge step.
- 'holdout': a stratified random `holdout_fraction` of each class's examples (at
  least one, leaving at least one) is held out, the grid is fitted on the rest
  (with that rest's own standardisation), scored on the held-out part like above,
  and the chosen strength is refitted on all few-shot examples (a second
  decomposition).
- Fallback: when some class has a single example (1-shot), leaving it out leaves
  its classifier no positive target, so accuracy on held-out examples carries no
  signal. Then both modes select by leave-one-out mean squared error alone (ties
  to the larger L2). In practice this tends to pick strong regularisation, where
  the ridge classifier approaches the prototype rule argmax_c <x, x_c> on
  standardised features, a sound 1-shot classifier.

- 'reference' is not a choice made here: `fit_each` fits every strength on all the
  few-shot examples and `reference_l2_index` applies the reference V-MoE code's
  rule to their test accuracies (evaluate/transfer.py). There `fit_each(...,
  design='reference')` builds the reference evaluator's design matrix instead:
  features scaled by their standard deviation + 1e-5 (a constant feature is not
  special) and a bias column of 100 rather than 1, so that the bias is almost
  unpenalised (lam ||w||^2 on a bias of weight b / 100).

Everything runs in float64 numpy on the host: the eigenproblem is
min(n, features + 1)-dimensional, and double precision keeps small L2 strengths
exact. Cost per fit: one eigendecomposition plus O(n r c) per strength.
"""
from typing import Iterator, NamedTuple, Sequence

import numpy as np

from vmoe_sparse_ot.config.fewshot_section import L2_SELECTIONS

# What `fit` chooses by, on the few-shot examples: the values of
# config.fewshot.l2_selection but 'reference' (which uses `fit_each`).
SELECTION_MODES = tuple(s for s in L2_SELECTIONS if s != 'reference')
# The design matrices `fit_each` builds: this module's, or the reference V-MoE
# few-shot evaluator's (scale std + 1e-5, bias column 100).
DESIGNS = ('ours', 'reference')
_REFERENCE_BIAS, _REFERENCE_STD_EPS = 100.0, 1e-5


class Spectrum(NamedTuple):
  """Thin SVD X = u diag(sqrt(s)) v^T of a design matrix, from one eigendecomposition.

  Attributes:
    u: (n, r) left singular vectors.
    s: (r,) squared singular values (eigenvalues of X^T X), all > 0.
    v: (p, r) right singular vectors.
  """
  u: np.ndarray
  s: np.ndarray
  v: np.ndarray


class RidgeFit(NamedTuple):
  """A fitted few-shot linear classifier and how its L2 strength was chosen.

  Attributes:
    weights: (p, c) with the bias as the last row (p = features + 1).
    mean: (p - 1,) feature means used for standardisation.
    scale: (p - 1,) feature standard deviations used for standardisation.
    l2_reg: the chosen L2 strength.
    l2_regs: (L,) the candidate strengths.
    selection_accuracy: (L,) held-out top-1 accuracy per candidate (NaN at 1-shot).
    selection_mse: (L,) held-out mean squared error per candidate.
    bias: the value of the design matrix's bias column (1; the reference's 100).
  """
  weights: np.ndarray
  mean: np.ndarray
  scale: np.ndarray
  l2_reg: float
  l2_regs: np.ndarray
  selection_accuracy: np.ndarray
  selection_mse: np.ndarray
  bias: float = 1.0

  def predict(self, features: np.ndarray) -> np.ndarray:
    """(N, p - 1) raw features -> (N, c) class scores."""
    return design_matrix(features, self.mean, self.scale, self.bias) @ self.weights


def standardization(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per-feature mean and standard deviation of (n, d) features; zero std -> 1."""
  features = np.asarray(features, np.float64)
  mean = features.mean(axis=0)
  scale = features.std(axis=0)
  return mean, np.where(scale > 0, scale, 1.0)


def design_matrix(features: np.ndarray, mean: np.ndarray, scale: np.ndarray,
                  bias: float = 1.0) -> np.ndarray:
  """(n, d) features -> (n, d + 1) standardised features with a trailing column of `bias`."""
  x = (np.asarray(features, np.float64) - mean) / scale
  return np.concatenate([x, np.full((x.shape[0], 1), float(bias))], axis=1)


def one_hot_pm1(labels: np.ndarray, num_classes: int) -> np.ndarray:
  """(n,) int labels -> (n, c) targets, +1 at the label and -1 elsewhere."""
  labels = np.asarray(labels)
  return np.where(labels[:, None] == np.arange(num_classes)[None, :], 1.0, -1.0)


def spectrum(x: np.ndarray) -> Spectrum:
  """Thin SVD of (n, p) `x` via `np.linalg.eigh` of the smaller of X^T X and X X^T.

  Directions whose eigenvalue is at round-off level (below max(n, p) * eps * s_max)
  are dropped: the ridge solution lies in the row space of X, so they only carry
  noise.
  """
  x = np.asarray(x, np.float64)
  n, p = x.shape
  primal = p <= n
  s, vecs = np.linalg.eigh(x.T @ x if primal else x @ x.T)
  keep = s > max(n, p) * np.finfo(np.float64).eps * max(s.max(initial=0.0), 0.0)
  s, vecs = s[keep], vecs[:, keep]
  sigma = np.sqrt(s)
  if primal:
    return Spectrum(u=(x @ vecs) / sigma, s=s, v=vecs)
  return Spectrum(u=vecs, s=s, v=(x.T @ vecs) / sigma)


def ridge_weights(spec: Spectrum, y: np.ndarray,
                  l2_regs: Sequence[float]) -> Iterator[np.ndarray]:
  """(p, c) ridge weights (X^T X + lam I)^{-1} X^T Y for each `lam` of `l2_regs`, in order."""
  uty = spec.u.T @ y  # (r, c), shared by every strength.
  sigma = np.sqrt(spec.s)
  for lam in l2_regs:
    yield spec.v @ ((sigma / (spec.s + lam))[:, None] * uty)


def ridge_weights_path(x: np.ndarray, y: np.ndarray, l2_regs: Sequence[float]) -> np.ndarray:
  """(L, p, c) ridge weights for every L2 strength, with one eigendecomposition."""
  return np.stack(list(ridge_weights(spectrum(x), np.asarray(y, np.float64), l2_regs)))


def loo_predictions(spec: Spectrum, y: np.ndarray,
                    l2_regs: Sequence[float]) -> Iterator[np.ndarray]:
  """(n, c) leave-one-out predictions for each strength of `l2_regs`, in order.

  Row i is the prediction for example i of the ridge fit on the other n - 1.
  """
  uty = spec.u.T @ y
  u2 = spec.u**2
  # 1 - H_ii written as a sum of non-negative terms, so it does not cancel when the
  # fit nearly interpolates (n <= p and small strengths).
  outside_row_space = np.clip(1.0 - u2.sum(axis=1), 0.0, None)
  for lam in l2_regs:
    fitted = spec.u @ ((spec.s / (spec.s + lam))[:, None] * uty)
    one_minus_h = np.maximum(outside_row_space + u2 @ (lam / (spec.s + lam)),
                             np.finfo(np.float64).tiny)
    yield y - (y - fitted) / one_minus_h[:, None]


def _scores(predictions: np.ndarray, y: np.ndarray, labels: np.ndarray):
  accuracy = np.mean(np.argmax(predictions, axis=1) == labels)
  mse = np.mean((predictions - y)**2)
  return accuracy, mse


def _choose(l2_regs: np.ndarray, accuracy: np.ndarray, mse: np.ndarray,
            use_accuracy: bool) -> int:
  """Index of the best strength: higher accuracy, then lower MSE, then larger L2."""
  primary = -accuracy if use_accuracy else np.zeros_like(mse)
  return int(np.lexsort((-l2_regs, mse, primary))[0])


def _check_inputs(features, labels, num_classes, l2_regs):
  features = np.asarray(features)
  labels = np.asarray(labels)
  if features.ndim != 2 or labels.shape != features.shape[:1]:
    raise ValueError(f'features must be (n, d) and labels (n,); got {features.shape} '
                     f'and {labels.shape}.')
  if labels.size == 0 or labels.min() < 0 or labels.max() >= num_classes:
    raise ValueError(f'labels must lie in [0, num_classes={num_classes}); got '
                     f'{np.unique(labels)[:10]}.')
  l2_regs = np.asarray(l2_regs, np.float64)
  if l2_regs.ndim != 1 or l2_regs.size == 0 or not np.all(l2_regs > 0):
    raise ValueError(f'l2_regs must be a non-empty sequence of positive numbers; got {l2_regs}.')
  return features, labels, l2_regs


def _holdout_split(labels: np.ndarray, holdout_fraction: float,
                   rng: np.random.Generator) -> np.ndarray:
  """Boolean (n,) mask of held-out examples: per class round(fraction * count), in [1, count-1]."""
  held = np.zeros(labels.shape, bool)
  for c in np.unique(labels):
    idx = np.flatnonzero(labels == c)
    k = min(len(idx) - 1, max(1, round(holdout_fraction * len(idx))))
    held[rng.choice(idx, size=k, replace=False)] = True
  return held


def fit(features: np.ndarray, labels: np.ndarray, *, num_classes: int,
        l2_regs: Sequence[float], selection: str = 'loo', holdout_fraction: float = 0.2,
        seed: int = 0) -> RidgeFit:
  """Fits the few-shot ridge classifier, choosing the L2 strength on the training set only.

  Args:
    features: (n, d) few-shot training features.
    labels: (n,) int labels in [0, num_classes).
    num_classes: c, width of the one-hot targets.
    l2_regs: (L,) positive candidate L2 strengths.
    selection: 'loo' or 'holdout' (see the module docstring).
    holdout_fraction: fraction of each class held out when selection='holdout'.
    seed: seeds the holdout split.

  Returns:
    A `RidgeFit` with the weights refitted on all n examples at the chosen strength.
  """
  if selection not in SELECTION_MODES:
    raise ValueError(f'selection must be one of {SELECTION_MODES}; got {selection!r}.')
  if not 0.0 < holdout_fraction < 1.0:
    raise ValueError(f'holdout_fraction must be in (0, 1); got {holdout_fraction}.')
  features, labels, l2_regs = _check_inputs(features, labels, num_classes, l2_regs)
  y = one_hot_pm1(labels, num_classes)
  mean, scale = standardization(features)
  spec = spectrum(design_matrix(features, mean, scale))
  counts = np.bincount(labels)
  use_accuracy = counts[counts > 0].min() >= 2

  accuracy = np.full(l2_regs.shape, np.nan)
  mse = np.empty(l2_regs.shape)
  if selection == 'holdout' and use_accuracy:
    held = _holdout_split(labels, holdout_fraction, np.random.default_rng(seed))
    fit_mean, fit_scale = standardization(features[~held])
    fit_spec = spectrum(design_matrix(features[~held], fit_mean, fit_scale))
    x_held = design_matrix(features[held], fit_mean, fit_scale)
    for j, w in enumerate(ridge_weights(fit_spec, y[~held], l2_regs)):
      accuracy[j], mse[j] = _scores(x_held @ w, y[held], labels[held])
  else:
    for j, pred in enumerate(loo_predictions(spec, y, l2_regs)):
      accuracy[j], mse[j] = _scores(pred, y, labels)
    if not use_accuracy:
      accuracy[:] = np.nan
  best = _choose(l2_regs, accuracy, mse, use_accuracy)
  (weights,) = ridge_weights(spec, y, l2_regs[best:best + 1])
  return RidgeFit(
      weights=weights, mean=mean, scale=scale,
      l2_reg=float(l2_regs[best]), l2_regs=l2_regs, selection_accuracy=accuracy,
      selection_mse=mse)


def fit_each(features: np.ndarray, labels: np.ndarray, *, num_classes: int,
             l2_regs: Sequence[float], design: str = 'ours') -> list[RidgeFit]:
  """One `RidgeFit` per strength of `l2_regs`, each on all n examples (one decomposition).

  For a choice made elsewhere (`reference_l2_index`); no selection scores.
  `design`: 'ours' (see `design_matrix`), or 'reference', the reference V-MoE
  few-shot evaluator's (features scaled by std + 1e-5, a bias column of 100).
  """
  if design not in DESIGNS:
    raise ValueError(f'design must be one of {DESIGNS}; got {design!r}.')
  features, labels, l2_regs = _check_inputs(features, labels, num_classes, l2_regs)
  y = one_hot_pm1(labels, num_classes)
  if design == 'reference':
    features = np.asarray(features, np.float64)
    mean, scale = features.mean(axis=0), features.std(axis=0) + _REFERENCE_STD_EPS
    bias = _REFERENCE_BIAS
  else:
    (mean, scale), bias = standardization(features), 1.0
  spec = spectrum(design_matrix(features, mean, scale, bias))
  none = np.full(l2_regs.shape, np.nan)
  return [RidgeFit(weights=w, mean=mean, scale=scale, l2_reg=float(lam), l2_regs=l2_regs,
                   selection_accuracy=none, selection_mse=none, bias=bias)
          for lam, w in zip(l2_regs, ridge_weights(spec, y, l2_regs))]


def reference_l2_index(accuracies: np.ndarray) -> int:
  """The strength the reference V-MoE few-shot evaluator reports, from test accuracies.

  accuracies: (T, L), the test accuracy of each of T fits (every dataset and seed
  of one shot count) at each of the L strengths. Within each fit the strengths are
  ranked by accuracy (0 the worst, L - 1 the best; equal accuracies ranked in grid
  order); the index of the best mean rank over the T fits is returned (the first
  of equal means).
  """
  accuracies = np.asarray(accuracies, np.float64)
  if accuracies.ndim != 2 or not accuracies.size:
    raise ValueError(f'accuracies must be (fits, strengths); got shape {accuracies.shape}')
  order = np.argsort(accuracies, axis=1, kind='stable')
  ranks = np.empty_like(order)
  np.put_along_axis(ranks, order, np.arange(accuracies.shape[1])[None, :], axis=1)
  return int(np.argmax(ranks.mean(axis=0)))
