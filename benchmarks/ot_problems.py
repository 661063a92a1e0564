"""The OT benchmarks' grid problem, in numpy alone (no JAX flags, no POT), so that
scripts for machines without POT (benchmarks/gpu_probe.py) build the same problem
as benchmarks/ot_solvers.py."""
import numpy as np


def grid_problem(m, n, seed=0):
  """Uniform marginals, squared Euclidean cost between 2-d Gaussian clouds, max 1."""
  rng = np.random.RandomState(seed)
  X, Y = rng.randn(m, 2), rng.randn(n, 2)
  C = ((X[:, None] - Y[None]) ** 2).sum(-1)
  return np.full(m, 1.0 / m), np.full(n, 1.0 / n), C / C.max()
