"""Shared helpers for the OT tests."""
import contextlib
import io
import itertools

import jax
import numpy as np

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.ot import selection

# The objectives, jitted once for every OT test file (the regularizer a pytree
# argument): called eagerly, each primitive inside compiles on its own, per shape.
semi_dual_objective = jax.jit(ot.semi_dual_objective)
dual_objective = jax.jit(ot.dual_objective)
primal_objective = jax.jit(ot.primal_objective)
# Likewise the simplex threshold (axis static) and densify (m and axis static).
simplex_threshold = jax.jit(ot.simplex_threshold, static_argnames="axis")
densify = jax.jit(selection.densify, static_argnames=("m", "axis"))


def pot():
  """POT, imported lazily (conftest at the root keeps TensorFlow out of it)."""
  import ot as pot_module
  return pot_module


def quiet(fn, *args, **kwargs):
  """Calls fn silencing stdout (POT's sparse simplex projection prints per call)."""
  with contextlib.redirect_stdout(io.StringIO()):
    return fn(*args, **kwargs)


def problem(m, n, seed=0, uniform=True, shift=0.0):
  """A small OT problem: squared Euclidean cost between 2-d point clouds in [0, 1].

  shift: moves the second cloud by (shift, shift) before the cost is scaled.
  """
  rng = np.random.RandomState(seed)
  X, Y = rng.randn(m, 2), rng.randn(n, 2) + shift
  C = ((X[:, None] - Y[None]) ** 2).sum(-1)
  C /= C.max()
  if uniform:
    a, b = np.full(m, 1.0 / m), np.full(n, 1.0 / n)
  else:
    a, b = rng.rand(m) + 0.5, rng.rand(n) + 0.5
    a /= a.sum()
    b /= b.sum()
  return a, b, C


def supports(m, k):
  """All supports of size 1..k of range(m)."""
  for size in range(1, min(k, m) + 1):
    yield from itertools.combinations(range(m), size)


def force_kernel(monkeypatch, kernel: str):
  """Makes every top-k selection use `kernel` ("radix" or "passes"), along any axis."""
  threshold = 1 if kernel == "radix" else 10 ** 9
  for table in ("_RADIX_MIN_K", "_RADIX_MIN_K_MINOR"):
    monkeypatch.setattr(selection, table, {4: threshold, 8: threshold})


def spy(monkeypatch, module, name: str) -> list:
  """Replaces module.name by a wrapper that records each call's positional
  arguments in the returned list and then calls the original."""
  original = getattr(module, name)
  calls = []

  def wrapper(*args, **kwargs):
    calls.append(args)
    return original(*args, **kwargs)
  monkeypatch.setattr(module, name, wrapper)
  return calls


def fd_grad(f, x, h=1e-6):
  """Central finite differences of the scalar f at the vector x."""
  g = np.zeros_like(x)
  for i in range(len(x)):
    e = np.zeros_like(x)
    e[i] = h
    g[i] = (f(x + e) - f(x - e)) / (2 * h)
  return g
