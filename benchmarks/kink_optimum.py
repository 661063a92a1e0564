"""Kink-bound problems: POT, L-BFGS alone, `ot.solve` defaults and the exact optimum.

Where k binds (more rows want a column than its k places), the semi-dual's
optimum sits on a kink and L-BFGS stops short of it; `ot.solve`'s defaults
then finish with the interior point (see its "Kinks"). For each kink-bound
benchmark problem this prints, side by side: POT's `smooth_ot_semi_dual`
(defaults), `ot.solve(..., interior_point=False)` (L-BFGS alone), `ot.solve`
(defaults) and `ot.solve_interior_point` (the barrier method on P_Psi) --
objective, warm time (best of --repeats), first call -- and each objective's
relative deficit against the interior point's, whose two-sided gap (P_Psi of
its plan minus its semi-dual value) bounds how far that one is from the
optimum.

    python benchmarks/kink_optimum.py [--repeats N] [--threads 1] [--large]
    python benchmarks/kink_optimum.py --sweep 40    # random problems, the switch rule

--sweep N draws N random problems (50-3000 rows, 3-40 columns, k from 1 to
past binding, gamma 0.01-1, Gaussian clouds or uniform costs) and prints, for
each, the fraction of the mass L-BFGS's plan misses, whether the defaults
switched, and how far L-BFGS alone and the defaults end from the interior
point's optimum: where the 0.1% switch rule separates stops within 1e-6 from
the others.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

import xla_threads  # noqa: E402  (the benchmarks folder is sys.path[0])

xla_threads.from_argv()
os.environ.setdefault("POT_BACKEND_DISABLE_TENSORFLOW", "1")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

from ot_solvers import grid_problem, pot_solve  # noqa: E402

from vmoe_sparse_ot import ot  # noqa: E402

# The benchmark grid's kink-bound rows (benchmarks/ot_solvers.py).
PROBLEMS = [(100, 100, 2, 1.0), (2000, 64, 64, 1.0), (5000, 10, 5, 0.1), (5000, 10, 50, 0.1),
            (50000, 10, 5750, 0.1), (10000, 100, 100, 0.1)]
# --large: the grid's large-n rows, where the dense interior point is slow
# (~20 s and ~150 s) but tells how far the defaults are from the optimum.
LARGE = [(500, 500, 5, 0.1), (1000, 1000, 5, 0.1)]


def timed(fn, repeats):
  """(first call s, best warm s, result)."""
  t0 = time.perf_counter()
  out = jax.block_until_ready(fn())
  first = time.perf_counter() - t0
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - t0)
  return first, best, out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--threads", type=int, default=None, help="XLA CPU threads (read at start)")
  p.add_argument("--large", action="store_true",
                 help="the 500 x 500 and 1000 x 1000 rows instead (minutes)")
  p.add_argument("--sweep", type=int, default=0, metavar="N",
                 help="N random problems instead: the switch rule's evidence")
  args = p.parse_args(argv)
  if args.sweep:
    return sweep(args.sweep)
  print("| problem (m,n,k,gamma) | POT objective | POT s | L-BFGS alone objective | s "
        "| defaults: status | objective | s (1st call) | interior objective | s "
        "| Newton steps | interior gap | POT deficit | L-BFGS deficit | defaults deficit |")
  print("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  for m, n, k, gamma in LARGE if args.large else PROBLEMS:
    a, b, C = grid_problem(m, n)
    reg = ot.SparsityConstrained(k, gamma)
    pot_s, pot_obj = min(pot_solve(a, b, C, k, gamma) for _ in range(args.repeats))[:2]
    # The defaults first: their first call compiles both solvers.
    df_first, df_s, df = timed(lambda: ot.solve(a, b, C, reg), args.repeats)
    _, lb_s, lb = timed(lambda: ot.solve(a, b, C, reg, interior_point=False), args.repeats)
    _, ip_s, ip = timed(lambda: ot.solve_interior_point(a, b, C, reg), args.repeats)
    best = float(ip.value)

    def deficit(v):
      return (float(v) - best) / abs(best)
    print(f"| ({m},{n},{k},{gamma:g}) | {pot_obj:.10g} | {pot_s:.3f} | {float(lb.value):.10g} "
          f"| {lb_s:.3f} | {df.reason()} | {float(df.value):.10g} | {df_s:.3f} ({df_first:.2f}) "
          f"| {best:.10g} | {ip_s:.3f} | {int(ip.num_iter)} "
          f"| {float(ip.duality_gap) / abs(best):.1e} | {deficit(pot_obj):.1e} "
          f"| {deficit(lb.value):.1e} | {deficit(df.value):.1e} |", flush=True)


def random_problem(rng):
  """(a, b, C, reg): a random problem, often but not always binding."""
  m = int(rng.choice([50, 120, 300, 800, 3000]))
  n = int(rng.choice([3, 5, 10, 20, 40]))
  k = max(1, int(m / n * rng.choice([0.2, 0.5, 0.9, 1.1, 1.5, 3.0])))
  k = min(k, m - 1)
  gamma = float(rng.choice([0.01, 0.1, 1.0]))
  if rng.rand() < 0.5:
    X, Y = rng.randn(m, 2), rng.randn(n, 2) + rng.randn(2)
    C = ((X[:, None] - Y[None]) ** 2).sum(-1)
    C /= C.max()
  else:
    C = rng.rand(m, n)
  a, b = rng.rand(m) + 0.2, rng.rand(n) + 0.2
  return a / a.sum(), b / b.sum(), C, ot.SparsityConstrained(k, gamma)


def sweep(count, seed=0):
  rng = np.random.RandomState(seed)
  print("| # | m | n | k | gamma | L-BFGS status | mass missed | L-BFGS deficit "
        "| defaults status | defaults deficit | interior gap |")
  print("|---:|---:|---:|---:|---:|---|---:|---:|---|---:|---:|")
  worst_kept = 0.0
  for i in range(count):
    a, b, C, reg = random_problem(rng)
    m, n = C.shape
    lb = ot.solve(a, b, C, reg, interior_point=False)
    df = ot.solve(a, b, C, reg)
    ip = ot.solve_interior_point(a, b, C, reg)
    best = max(float(ip.value), float(df.value), float(lb.value))
    missed = float(np.abs(a - np.asarray(lb.plan).sum(1)).sum())

    def deficit(v):
      return (float(v) - best) / abs(best)
    if df.reason() != "interior_point":
      worst_kept = min(worst_kept, deficit(df.value))
    print(f"| {i} | {m} | {n} | {reg.k} | {reg.gamma:g} | {lb.reason()} | {missed:.2%} "
          f"| {deficit(lb.value):.1e} | {df.reason()} | {deficit(df.value):.1e} "
          f"| {float(ip.duality_gap) / abs(best):.1e} |", flush=True)
  print(f"\nWorst deficit where the defaults kept L-BFGS's point: {worst_kept:.1e}")


if __name__ == "__main__":
  main()
