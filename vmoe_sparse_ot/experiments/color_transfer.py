"""Appendix figure "Result comparison on the color transfer task".

The setup of Blondel, Seguy & Rolet (2018, section 6) on scikit-learn's two
sample photos (china.jpg and flower.jpg, 427 x 640 RGB, shipped with the package):
each image's colors (RGB in [0, 1]) are quantised with k-means into NUM_COLORS
clusters (fit on a random subset of pixels, then every pixel assigned); a and b
are the clusters' pixel frequencies, C the squared Euclidean distances between
cluster centres. A plan T maps source color x_i to its barycentric projection
sum_j T_ij y_j / sum_j T_ij, and every pixel takes its cluster's new color.

Plans (each transfer direction solved on its own): sparsity-constrained with
at most k = 2 nonzeros per row (the transposed problem, see `plan`) and squared
2-norm with gamma = 0.1 (the paper's pairing, which gives comparably sparse
plans; same gamma for both), entropic (the project's Sinkhorn,
epsilon = 0.01, the smallest of 1e-2, 1e-3 whose plan stays fully dense in
float64) and unregularized (POT `ot.emd`). Each image is labelled with its plan's
percentage of nonzeros.

Full size: 256 colors; --quick: 32 colors on images downsampled 4x.
"""
import os

import jax
import numpy as np
from sklearn.cluster import KMeans
from sklearn.datasets import load_sample_images

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.experiments import common, style

NAME = 'color_transfer'
GAMMA = 0.1
EPSILON = 0.01
K = 2
NUM_COLORS = {False: 256, True: 32}
KMEANS_SAMPLES = {False: 20000, True: 3000}
DOWNSAMPLE = {False: 1, True: 4}
METHODS = ('sparsity_constrained', 'squared_l2', 'entropic', 'unregularized')
LABELS = {'sparsity_constrained': f'Sparsity-constr. (k={K})',
          'squared_l2': f'Squared 2-norm (γ={GAMMA:g})',
          'entropic': f'Entropic (ε={EPSILON:g})',
          'unregularized': 'Unregularized'}


def images(quick: bool = False) -> dict:
  """{'china': (H, W, 3), 'flower': (H, W, 3)} float64 in [0, 1]."""
  data = load_sample_images()
  step = DOWNSAMPLE[quick]
  out = {}
  for filename, img in zip(data.filenames, data.images):
    out[os.path.splitext(os.path.basename(filename))[0]] = (
        img[::step, ::step].astype(np.float64) / 255.0)
  return out


def quantise(img, num_colors: int, num_samples: int, seed: int = 0):
  """k-means palette of img (H, W, 3): centres (N, 3), frequencies (N,), labels (H, W)."""
  pixels = img.reshape(-1, 3)
  rng = np.random.default_rng(seed)
  subset = pixels[rng.choice(len(pixels), min(num_samples, len(pixels)), replace=False)]
  km = KMeans(num_colors, n_init=1, random_state=seed).fit(subset)
  labels = km.predict(pixels)
  counts = np.bincount(labels, minlength=num_colors).astype(np.float64)
  # A centre no pixel picks would be a zero-mass row; drop it.
  keep = counts > 0
  remap = np.cumsum(keep) - 1
  return km.cluster_centers_[keep], counts[keep] / counts.sum(), remap[labels].reshape(
      img.shape[:2])


def problem(quick: bool = False, seed: int = 0, source: str = 'china', target: str = 'flower'):
  """(a (m,), b (n,), C (m, n)) of the color transfer source -> target."""
  imgs = images(quick)
  X, a, _ = quantise(imgs[source], NUM_COLORS[quick], KMEANS_SAMPLES[quick], seed)
  Y, b, _ = quantise(imgs[target], NUM_COLORS[quick], KMEANS_SAMPLES[quick], seed)
  return a, b, ((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1)


def plan(method: str, a, b, C) -> np.ndarray:
  """The plan (m, n) of one method; sparsity-constrained: at most K nonzeros per ROW.

  The barycentric map averages over a row, so the cardinality constraint belongs
  on the rows (each source color goes to at most K target colors): we solve the
  transposed problem, whose semi-dual plan also meets the row marginal a exactly
  (a column of the transposed plan lies in a_i times the simplex), so no source
  color is left without mass.
  """
  if method == 'sparsity_constrained':
    with jax.enable_x64(True):
      return np.asarray(common.solve_plan(b, a, C.T, ot.SparsityConstrained(K, GAMMA)).plan).T
  if method == 'unregularized':
    with common.quiet_stdout():
      return np.asarray(common.pot().emd(a, b, C))
  with jax.enable_x64(True):
    if method == 'entropic':
      return np.asarray(common.sinkhorn_plan(a, b, C, EPSILON).plan)
    return np.asarray(common.solve_plan(a, b, C, ot.SquaredL2(GAMMA)).plan)


def transfer(T, Y, labels) -> np.ndarray:
  """Recolours an image: pixel of cluster i -> sum_j T_ij y_j / sum_j T_ij."""
  rows = T.sum(1, keepdims=True)
  new = (T @ Y) / np.where(rows > 0, rows, 1.0)
  return np.clip(new[labels], 0.0, 1.0)


def run(out_dir: str, *, quick: bool, seeds: int | None) -> dict:
  del seeds  # one seeded draw, as in the paper's figure
  seed = 0
  imgs = images(quick)
  palettes = {name: quantise(img, NUM_COLORS[quick], KMEANS_SAMPLES[quick], seed)
              for name, img in imgs.items()}
  directions = (('china', 'flower'), ('flower', 'china'))
  results, stats = {}, {}
  for src, tgt in directions:
    X, a, labels = palettes[src]
    Y, b, _ = palettes[tgt]
    C = ((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1)
    for method in METHODS:
      T = plan(method, a, b, C)
      results[(src, method)] = transfer(T, Y, labels)
      stats.setdefault(f'{src}_to_{tgt}', {})[method] = {
          'percent_nonzeros': 100.0 * style.nnz(T) / T.size,
          'nonzeros': style.nnz(T),
          'max_nonzeros_per_row': common.max_col_nnz(T.T),
          'min_entry': float(T.min()),
          'transport_cost': float(np.sum(T * C)),
          'max_row_marginal_error': float(np.abs(T.sum(1) - a).max()),
          'max_column_marginal_error': float(np.abs(T.sum(0) - b).max()),
          'shape': list(T.shape)}

  ncols = 2 + len(METHODS)
  fig, axes = style.figure(2, ncols, width=1.95 * ncols, height=3.3,
                           title=f'Color transfer ({NUM_COLORS[quick]} colors per image; '
                                 'percentage of nonzeros of each plan)')
  for row, (src, tgt) in enumerate(directions):
    panels = [(imgs[src], f'source: {src}'), (imgs[tgt], f'colors of: {tgt}')]
    for method in METHODS:
      pct = stats[f'{src}_to_{tgt}'][method]['percent_nonzeros']
      panels.append((results[(src, method)], f'{LABELS[method]}\n{pct:.2f}% nonzeros'))
    for ax, (img, label) in zip(axes[row], panels):
      ax.imshow(img, interpolation='antialiased')
      ax.set_title(label, fontsize=8)
      ax.axis('off')
  path = style.save(fig, os.path.join(out_dir, f'{NAME}.png'))
  return {'figure': path, 'seed': seed, 'k': K, 'gamma': GAMMA, 'epsilon': EPSILON,
          'num_colors': NUM_COLORS[quick], 'downsample': DOWNSAMPLE[quick],
          'image_shapes': {name: list(img.shape) for name, img in imgs.items()},
          'directions': stats}


def format_table(payload: dict) -> str:
  rows = [('direction', 'plan', '% nonzeros', 'max per row', '<T, C>', 'col marg. err')]
  for direction, ms in payload['directions'].items():
    for method, s in ms.items():
      rows.append((direction, method, f"{s['percent_nonzeros']:.3f}", s['max_nonzeros_per_row'],
                   f"{s['transport_cost']:.4f}", f"{s['max_column_marginal_error']:.1e}"))
  return common.format_rows(rows, title=f"{NAME}: {payload['num_colors']} colors, k = "
                            f"{payload['k']}, gamma = {payload['gamma']}, epsilon = "
                            f"{payload['epsilon']}")
