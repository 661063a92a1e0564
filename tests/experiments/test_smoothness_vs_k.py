"""smoothness_vs_k --quick: Omega*_+ of (s1, s2, 0, 1) gets smoother as k grows."""
import jax
import numpy as np
import pytest

from tests.experiments.conftest import pngs, quick_run
from vmoe_sparse_ot.experiments import smoothness_vs_k

NAME = 'smoothness_vs_k'


@pytest.fixture(scope='module')
def payload(out_dir, all_dir):
  return quick_run(NAME, out_dir, all_dir)


def test_files_and_keys(payload, out_dir):
  assert pngs(out_dir, NAME) == [f'{NAME}.png']
  assert payload['ks'] == [1, 2, 3, 4]
  assert set(payload['max_second_difference']) == {'1', '2', '3', '4'}


def test_smoother_with_k(payload):
  d = {int(k): v for k, v in payload['max_second_difference'].items()}
  assert d[1] > d[2] > d[3]
  assert d[4] <= d[3] + 1e-9
  # k = 1, 2 have kinks (second differences ~ 1/h); k >= 3 is C^1 here with a
  # 1/gamma-Lipschitz gradient, so its second differences stay <= 1/gamma.
  assert d[2] > 10 / smoothness_vs_k.GAMMA
  assert d[3] <= 1 / smoothness_vs_k.GAMMA + 1e-9


def test_max_values_by_hand(payload):
  # At s = (2, 2, 0, 1), gamma = 1: 1/2 * (sum of the k largest [s_i]_+^2).
  assert payload['max_value'] == pytest.approx({'1': 2.0, '2': 4.0, '3': 4.5, '4': 4.5})


def test_grid_matches_numpy_reference():
  rng = np.random.default_rng(0)
  s1, s2 = rng.uniform(-2, 2, (2, 5, 7))
  s = np.stack([s1, s2, np.zeros_like(s1), np.ones_like(s1)])
  with jax.enable_x64(True):
    for k in (1, 2, 3, 4):
      top = -np.sort(-s, axis=0)[:k]
      want = 0.5 * np.sum(np.maximum(top, 0) ** 2, axis=0)
      np.testing.assert_allclose(smoothness_vs_k.conj_plus_grid(k, s1, s2), want, rtol=1e-12)


def test_second_difference_of_a_quadratic():
  g = np.linspace(-1, 1, 11)
  s1, s2 = np.meshgrid(g, g, indexing='ij')
  h = g[1] - g[0]
  assert smoothness_vs_k.max_second_difference(1.5 * s1 ** 2 + s1 * s2, h) == pytest.approx(3.0)
