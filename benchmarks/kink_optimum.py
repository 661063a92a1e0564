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
"""
from __future__ import annotations

import argparse
import os
import time

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
  args = p.parse_args(argv)
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


if __name__ == "__main__":
  main()
