"""Sparse-OT solvers: this project (JAX) against POT's `ot.smooth`, side by side.

For each problem (m, n, k, gamma) both solve the sparsity-constrained semi-dual
with L-BFGS from alpha = 0 (POT: scipy L-BFGS-B, its defaults stopThr=1e-9,
numItermax=500; ours: `ot.solve(..., solver="lbfgs")` jitted, float64, stopped by
the predicted remaining gain (rtol) or by small achieved and predicted gains
(ftol; grid problems only, see --router-ftol)). Printed:
warm solve time (median of repeats, compile excluded), compile time, iterations
(objective evaluations in parentheses), the semi-dual objective reached, the
relative objective deficit (POT - ours) / |POT| (<= 0 means ours is at least as
good) and the speed-up POT time / our time.

The router batch is 64 problems of 256 x 32 with k = 16 solved in one `vmap`
against POT in a Python loop; its objective is summed over the 64 problems and the
worst per-problem deficit is reported.

    python benchmarks/ot_solvers.py [--json PATH] [--repeats N] [--quick]
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
import time

os.environ.setdefault("POT_BACKEND_DISABLE_TENSORFLOW", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import ot as pot  # noqa: E402

from vmoe_sparse_ot import ot  # noqa: E402

GRID = [(100, 100, 2, 1.0), (500, 500, 5, 0.1), (1000, 1000, 5, 0.1), (2000, 64, 64, 1.0)]
ROUTER = dict(batch=64, m=256, n=32, k=16, gamma=1.0)


def grid_problem(m, n, seed=0):
  """Uniform marginals, squared Euclidean cost between 2-d Gaussian clouds, max 1."""
  rng = np.random.RandomState(seed)
  X, Y = rng.randn(m, 2), rng.randn(n, 2)
  C = ((X[:, None] - Y[None]) ** 2).sum(-1)
  return np.full(m, 1.0 / m), np.full(n, 1.0 / n), C / C.max()


def router_problems(batch, m, n, seed=0):
  """Tokens x experts: cost = -logits shifted to be >= 0, uniform marginals."""
  rng = np.random.RandomState(seed)
  logits = rng.randn(batch, m, n)
  C = logits.max(axis=(1, 2), keepdims=True) - logits
  return np.full((batch, m), 1.0 / m), np.full((batch, n), 1.0 / n), C


def pot_solve(a, b, C, k, gamma):
  with contextlib.redirect_stdout(io.StringIO()):  # POT prints in its projection
    t0 = time.perf_counter()
    _, log = pot.smooth.smooth_ot_semi_dual(a, b, C, gamma, reg_type="sparsity_constrained",
                                            max_nz=k, log=True)
    dt = time.perf_counter() - t0
  return dt, -float(log["res"].fun), int(log["res"].nit), int(log["res"].nfev)


def time_jax(fn, args, repeats):
  """Compile time (lower + compile) and median warm time of a jitted fn."""
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  t_compile = time.perf_counter() - t0
  out = jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t0)
  return t_compile, statistics.median(times), out


def make_solver(k, gamma, tol, max_iter, ftol, rtol, patience):
  reg = ot.SparsityConstrained(k=k, gamma=gamma)

  def fn(a, b, C):
    r = ot.solve(a, b, C, reg, formulation="semi_dual", solver="lbfgs", tol=tol,
                 max_iter=max_iter, ftol=ftol, rtol=rtol, patience=patience)
    return r.value, r.num_iter, r.num_evals, r.grad_norm
  return fn


def run(args):
  rows = []
  grid = GRID[:2] if args.quick else GRID
  header = (f"{'problem':<24}{'POT s':>9}{'ours s':>9}{'compile s':>10}{'speed-up':>9}"
            f"{'POT it(ev)':>12}{'our it(ev)':>12}{'POT objective':>17}{'our objective':>17}"
            f"{'rel deficit':>12}")
  print(header)
  print("-" * len(header))
  for (m, n, k, gamma) in grid:
    a, b, C = grid_problem(m, n)
    p_time, p_obj, p_nit, p_nfev = pot_solve(a, b, C, k, gamma)
    fn = make_solver(k, gamma, args.tol, args.max_iter, args.ftol, args.rtol, args.patience)
    t_c, t_w, (val, nit, nev, gn) = time_jax(fn, (jnp.asarray(a), jnp.asarray(b),
                                                   jnp.asarray(C)), args.repeats)
    row = dict(problem=f"({m},{n},{k},{gamma:g})", m=m, n=n, k=k, gamma=gamma,
               pot_time_s=p_time, time_s=t_w, compile_s=t_c, speedup=p_time / t_w,
               pot_iter=p_nit, pot_evals=p_nfev, iter=int(nit), evals=int(nev),
               pot_objective=p_obj, objective=float(val),
               rel_deficit=(p_obj - float(val)) / abs(p_obj), grad_norm=float(gn))
    rows.append(row)
    print_row(row)

  r = ROUTER
  A, B, Cs = router_problems(r["batch"], r["m"], r["n"])
  p_time, p_objs, p_nits = 0.0, [], []
  n_pot = 8 if args.quick else r["batch"]
  for i in range(n_pot):
    dt, obj, nit, _ = pot_solve(A[i], B[i], Cs[i], r["k"], r["gamma"])
    p_time += dt
    p_objs.append(obj)
    p_nits.append(nit)
  p_time *= r["batch"] / n_pot
  fn = jax.vmap(make_solver(r["k"], r["gamma"], args.tol, args.max_iter, args.router_ftol,
                            args.rtol, args.patience))
  t_c, t_w, (vals, nits, nevs, gns) = time_jax(
      fn, (jnp.asarray(A), jnp.asarray(B), jnp.asarray(Cs)), args.repeats)
  vals = np.asarray(vals)
  deficits = (np.asarray(p_objs) - vals[:n_pot]) / np.abs(p_objs)
  row = dict(problem=f"router {r['batch']}x({r['m']}x{r['n']},k={r['k']})", m=r["m"],
             n=r["n"], k=r["k"], gamma=r["gamma"], batch=r["batch"], pot_time_s=p_time,
             time_s=t_w, compile_s=t_c, speedup=p_time / t_w,
             pot_iter=int(np.max(p_nits)), pot_evals=-1, iter=int(np.max(nits)),
             evals=int(np.max(nevs)), pot_objective=float(np.sum(p_objs)),
             objective=float(np.sum(vals[:n_pot])), rel_deficit=float(deficits.max()),
             grad_norm=float(np.max(gns)), pot_problems_timed=n_pot)
  rows.append(row)
  print_row(row)
  meta = dict(command=" ".join([os.path.basename(sys.executable)] + sys.argv), jax=jax.__version__,
              pot=pot.__version__, dtype="float64", tol=args.tol, ftol=args.ftol,
              router_ftol=args.router_ftol, rtol=args.rtol, patience=args.patience,
              max_iter=args.max_iter,
              repeats=args.repeats, cpu_count=os.cpu_count(),
              load_avg=os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
  print(f"\nours: ot.solve(semi_dual, lbfgs, tol={args.tol:g}, ftol={args.ftol:g} "
        f"(router {args.router_ftol:g}), rtol={args.rtol:g}, patience={args.patience}, "
        f"max_iter={args.max_iter}), "
        f"float64; POT {pot.__version__}: smooth_ot_semi_dual defaults. "
        f"load average {meta['load_avg']}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(meta=meta, results=rows), f, indent=2)
  return rows


def print_row(r):
  print(f"{r['problem']:<24}{r['pot_time_s']:>9.3f}{r['time_s']:>9.4f}{r['compile_s']:>10.2f}"
        f"{r['speedup']:>8.1f}x{r['pot_iter']:>6}({r['pot_evals']:>4}){r['iter']:>6}"
        f"({r['evals']:>4}){r['pot_objective']:>17.10g}{r['objective']:>17.10g}"
        f"{r['rel_deficit']:>12.2e}", flush=True)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", help="also write the figures to this JSON file")
  p.add_argument("--repeats", type=int, default=5, help="warm runs per problem (median)")
  p.add_argument("--tol", type=float, default=1e-9, help="our gradient tolerance")
  p.add_argument("--max-iter", type=int, default=500, help="our iteration budget")
  p.add_argument("--ftol", type=float, default=3e-7,
                 help="our relative-improvement stop (the k-binding optimum is a kink); "
                      "fires when achieved and predicted gains are both below it")
  p.add_argument("--router-ftol", type=float, default=0.0,
                 help="ftol for the router batch (k does not bind there: the problems "
                      "are smooth and the rtol stop suffices; ftol stopped some early)")
  p.add_argument("--rtol", type=float, default=1e-8,
                 help="our stop on the predicted remaining gain -g^T p / 2 <= rtol |value|")
  p.add_argument("--patience", type=int, default=1, help="consecutive ftol hits to stop")
  p.add_argument("--quick", action="store_true", help="small grid, 8 POT router problems")
  run(p.parse_args(argv))


if __name__ == "__main__":
  main()
