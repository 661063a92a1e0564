"""Synthetic few-shot data shared by the evaluate tests."""
import numpy as np


def clusters(seed, num_classes, per_class, dim=32, noise=0.05):
  """(features, labels): Gaussian clusters around class centres fixed across seeds.

  Labels come shuffled; centres are N(0, 9) per coordinate, so with the default
  noise the classes are linearly separable by a wide margin.
  """
  centres = np.random.default_rng(1234).normal(size=(num_classes, dim)) * 3.0
  rng = np.random.default_rng(seed)
  labels = rng.permutation(np.repeat(np.arange(num_classes), per_class))
  return centres[labels] + noise * rng.normal(size=(len(labels), dim)), labels
