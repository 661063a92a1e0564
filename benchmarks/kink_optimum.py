"""Kink-bound problems: `ot.solve` defaults and POT against the exact optimum.

Where k binds (more rows want a column than its k places), the semi-dual's
optimum sits on a kink and L-BFGS stops short of it. For each such benchmark
problem this prints, side by side: POT's `smooth_ot_semi_dual` (defaults),
`ot.solve` (defaults), and `ot.solve_interior_point` (the barrier method on
P_Psi, defaults) -- objective, warm time (best of --repeats), first call --
and each objective's relative deficit against the interior point's, whose
two-sided gap (P_Psi of its plan minus its semi-dual value) bounds how far
that one is from the optimum.

    python benchmarks/kink_optimum.py [--repeats N] [--threads 1]
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
PROBLEMS = [(100, 100, 2, 1.0), (2000, 64, 64, 1.0), (5000, 10, 5, 0.1), (5000, 10, 50, 0.1)]


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
  args = p.parse_args(argv)
  print("| problem (m,n,k,gamma) | POT objective | POT s | defaults objective | defaults s "
        "| interior objective | interior s (1st call) | Newton steps | interior gap "
        "| POT deficit | defaults deficit |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
  for m, n, k, gamma in PROBLEMS:
    a, b, C = grid_problem(m, n)
    reg = ot.SparsityConstrained(k, gamma)
    pot_s, pot_obj = min(pot_solve(a, b, C, k, gamma) for _ in range(args.repeats))[:2]
    _, lb_s, lb = timed(lambda: ot.solve(a, b, C, reg), args.repeats)
    ip_first, ip_s, ip = timed(lambda: ot.solve_interior_point(a, b, C, reg), args.repeats)
    best = float(ip.value)

    def deficit(v):
      return (v - best) / abs(best)
    print(f"| ({m},{n},{k},{gamma:g}) | {pot_obj:.10g} | {pot_s:.3f} | {float(lb.value):.10g} "
          f"| {lb_s:.4f} | {best:.10g} | {ip_s:.3f} ({ip_first:.2f}) | {int(ip.num_iter)} "
          f"| {float(ip.duality_gap) / abs(best):.1e} | {deficit(pot_obj):.1e} "
          f"| {deficit(float(lb.value)):.1e} |", flush=True)


if __name__ == "__main__":
  main()
