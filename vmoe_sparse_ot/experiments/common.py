"""Helpers shared by several experiments: POT import, float64, timing, checks."""
import contextlib
import io
import os
import time

import jax
import numpy as np

from vmoe_sparse_ot import ot


def pot():
  """Imports POT (the `ot` package) without TensorFlow and returns the module."""
  os.environ.setdefault('POT_BACKEND_DISABLE_TENSORFLOW', '1')
  import ot as pot_module  # pylint: disable=import-outside-toplevel
  return pot_module


@contextlib.contextmanager
def quiet_stdout():
  """Swallows stdout (POT 0.9.7's sparse simplex projection prints a line per call)."""
  with contextlib.redirect_stdout(io.StringIO()):
    yield


def enable_x64():
  """Runs JAX in float64 (the experiments compare objective values to ~1e-8)."""
  jax.config.update('jax_enable_x64', True)


def seeds_or(seeds: int | None, default: int) -> int:
  return default if seeds is None else int(seeds)


def timed(fn, *args, **kwargs):
  """(result, seconds) of fn(*args, **kwargs), blocking on JAX arrays."""
  start = time.perf_counter()
  out = fn(*args, **kwargs)
  jax.block_until_ready(out)
  return out, time.perf_counter() - start


def max_col_nnz(T, rtol: float = 0.0) -> int:
  """Largest number of nonzeros in a column of plan T (m, n)."""
  T = np.asarray(T)
  return int(np.max(np.sum(np.abs(T) > rtol * np.abs(T).max(), axis=0)))


def format_rows(rows, title: str | None = None) -> str:
  """Left-aligned text table; rows[0] is the header."""
  rows = [[str(c) for c in r] for r in rows]
  widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
  lines = ['  '.join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
  lines.insert(1, '  '.join('-' * w for w in widths))
  return '\n'.join(([title] if title else []) + lines)


# Tight settings for the figures' plans: the objective is solved to round-off where
# it is smooth; ftol (an `ot.LBFGS` option) stops L-BFGS on the kinks that a
# binding k creates.
PLAN_SOLVE = dict(max_iter=3000, tol=1e-10)
PLAN_FTOL = 1e-14


def solve_plan(a, b, C, reg, formulation: str = 'semi_dual', **kwargs):
  """`ot.solve` with `PLAN_SOLVE` settings (overridable); returns the OTResult."""
  kwargs = {**PLAN_SOLVE, 'solver': ot.LBFGS(ftol=PLAN_FTOL), **kwargs}
  return ot.solve(a, b, C, reg, formulation=formulation, **kwargs)


def sinkhorn_plan(a, b, C, epsilon: float, max_iter: int = 20000, tol: float = 1e-10):
  """The entropic plan (the project's log-domain Sinkhorn); returns the SinkhornResult."""
  return ot.sinkhorn(a, b, C, epsilon, max_iter=max_iter, tol=tol)
