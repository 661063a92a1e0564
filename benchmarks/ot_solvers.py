"""Sparse-OT solvers: this project (JAX) against POT's `ot.smooth`, side by side.

For each problem (m, n, k, gamma) both solve the sparsity-constrained semi-dual
with L-BFGS: POT with scipy L-BFGS-B at its defaults (from alpha = 0,
stopThr=1e-9, numItermax=500); ours with `ot.solve(a, b, C, reg)` at ITS
DEFAULTS (from alpha = `ot.c_transform_start(b, C, reg)`; no tuning flags;
--tol/--rtol/--ftol/--max-iter override them), jitted, float64. Printed: warm
solve time (best of --repeats, POT too), first-call time (compile + first
run) and compile time in separate columns, iterations (objective evaluations
in parentheses), the objectives, the relative deficit
(POT - ours) / |POT| (<= 0: ours at least as good) and the speed-up POT time /
our warm time. "@POT obj": the first iteration at which our objective reaches
POT's final one, our warm time when stopped there (max_iter = that iteration),
and POT's time over it -- the speed-up at equal objective. A second table
("same start") runs POT's objective with the same scipy call from our start,
and ours to that run's objective: the speed-up that owes nothing to the start.

Rows: the small-k grid, the large-k rows (k ~ 1.15 m / n, as in the paper's MNIST
clustering; the radix top-k kernel), and the router batch (64 problems of
256 x 32 with k = 16 in one `vmap`, POT in a Python loop; objectives summed,
worst per-problem deficit). Then a k-sweep at (5000, 10, k).

    python benchmarks/ot_solvers.py [--json PATH] [--repeats N] [--quick]
    python benchmarks/ot_solvers.py --kernels     # top-k kernel crossover only
    python benchmarks/ot_solvers.py --float32     # float32 defaults against the float64 optimum
    python benchmarks/ot_solvers.py --only '(10000,100' --only router   # some rows
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time

import xla_threads  # noqa: E402  (the benchmarks folder is sys.path[0])

xla_threads.from_argv()  # before JAX starts
os.environ.setdefault("POT_BACKEND_DISABLE_TENSORFLOW", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import ot as pot  # noqa: E402
import scipy.optimize  # noqa: E402

from vmoe_sparse_ot import ot  # noqa: E402
from ot_problems import grid_problem  # noqa: E402  (also kink_optimum's, from here)

GRID = [(100, 100, 2, 1.0), (500, 500, 5, 0.1), (1000, 1000, 5, 0.1), (2000, 64, 64, 1.0)]
LARGE_K = [(2000, 10, 230, 0.1), (5000, 10, 575, 0.1), (10000, 100, 100, 0.1),
           (50000, 10, 5750, 0.1)]
K_SWEEP = (5000, 10, (5, 50, 575, 2500), 0.1)
ROUTER = dict(batch=64, m=256, n=32, k=16, gamma=1.0)


def router_problems(batch, m, n, seed=0):
  """Tokens x experts: cost = -logits shifted to be >= 0, uniform marginals."""
  rng = np.random.RandomState(seed)
  logits = rng.randn(batch, m, n)
  C = logits.max(axis=(1, 2), keepdims=True) - logits
  return np.full((batch, m), 1.0 / m), np.full((batch, n), 1.0 / n), C


def pot_solve(a, b, C, k, gamma, alpha0=None):
  """(time, objective, iterations, evaluations) of POT's semi-dual solve.

  alpha0 None: `smooth_ot_semi_dual` at its defaults (from alpha = 0, the only
  start it offers). Otherwise POT's own objective (`semi_dual_obj_grad`) with
  the same scipy call its `solve_semi_dual` makes (L-BFGS-B, tol = stopThr =
  1e-9, maxiter = 500), from alpha0."""
  with contextlib.redirect_stdout(io.StringIO()):  # POT prints in its projection
    t0 = time.perf_counter()
    if alpha0 is None:
      _, log = pot.smooth.smooth_ot_semi_dual(a, b, C, gamma, reg_type="sparsity_constrained",
                                              max_nz=k, log=True)
      res = log["res"]
    else:
      regul = pot.smooth.SparsityConstrained(gamma=gamma, max_nz=k)

      def neg(alpha):
        obj, grad = pot.smooth.semi_dual_obj_grad(alpha, a, b, C, regul)
        return -obj, -grad
      res = scipy.optimize.minimize(neg, alpha0, method="L-BFGS-B", jac=True, tol=1e-9,
                                    options=dict(maxiter=500))
      pot.smooth.get_plan_from_semi_dual(res.x, b, C, regul)  # as smooth_ot_semi_dual does
    dt = time.perf_counter() - t0
  return dt, -float(res.fun), int(res.nit), int(res.nfev)


def time_jax(fn, args, repeats):
  """(compile time, first-call time = compile + first run, best warm time, out).

  Best of `repeats`, as for POT: on a shared machine the minimum is the time
  least disturbed by other work (medians moved by 2x between runs here)."""
  t0 = time.perf_counter()
  compiled = jax.jit(fn).lower(*args).compile()
  t_compile = time.perf_counter() - t0
  out = jax.block_until_ready(compiled(*args))
  t_first = time.perf_counter() - t0
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t0)
  return t_compile, t_first, min(times), out


def solve_kwargs(overrides):
  """`ot.solve`'s keywords for the command line's overrides: --rtol, --ftol
  and --history are fields of its `solver=ot.LBFGS(...)`."""
  kwargs = {k: v for k, v in overrides.items() if k not in ot.LBFGS._fields}
  lbfgs = {k: v for k, v in overrides.items() if k in ot.LBFGS._fields}
  return dict(kwargs, solver=ot.LBFGS(**lbfgs)) if lbfgs else kwargs


def make_solver(k, gamma, overrides):
  """ot.solve with its defaults, except the flags given on the command line."""
  reg = ot.SparsityConstrained(k=k, gamma=gamma)

  def fn(a, b, C):
    r = ot.solve(a, b, C, reg, **solve_kwargs(overrides))
    return r.value, r.num_iter, r.num_evals, r.grad_norm
  return fn


def pot_best(a, b, C, k, gamma, repeats, alpha0=None):
  """pot_solve's result with the best time of `repeats` runs."""
  runs = [pot_solve(a, b, C, k, gamma, alpha0) for _ in range(max(1, repeats))]
  return (min(r[0] for r in runs),) + runs[0][1:]


def solve_row(m, n, k, gamma, overrides, repeats, with_pot=True, with_same_start=True):
  a, b, C = grid_problem(m, n)
  p_time, p_obj, p_nit, p_nfev = pot_best(a, b, C, k, gamma, repeats) if with_pot else (
      float("nan"), float("nan"), -1, -1)
  t_c, t_f, t_w, (val, nit, nev, gn) = time_jax(
      make_solver(k, gamma, overrides), (jnp.asarray(a), jnp.asarray(b), jnp.asarray(C)),
      repeats)
  at_pot = dict(iter_at_pot=-1, time_at_pot_s=float("nan"), objective_at_pot=float("nan"))
  same_start = {}
  if with_pot:
    args_ = (jnp.asarray(a), jnp.asarray(b), jnp.asarray(C))
    at_pot = time_to_objective(k, gamma, overrides, args_, p_obj, repeats)
  if with_pot and with_same_start:
    # POT from our default start too: how much of the speed-up is the start.
    alpha0 = np.asarray(ot.c_transform_start(args_[1], args_[2],
                                             ot.SparsityConstrained(k=k, gamma=gamma)))
    q_time, q_obj, q_nit, q_nfev = pot_best(a, b, C, k, gamma, repeats, alpha0)
    q_at = time_to_objective(k, gamma, overrides, args_, q_obj, repeats)
    same_start = dict(pot_same_start_time_s=q_time, pot_same_start_objective=q_obj,
                      pot_same_start_iter=q_nit, pot_same_start_evals=q_nfev,
                      iter_at_pot_same_start=q_at["iter_at_pot"],
                      time_at_pot_same_start_s=q_at["time_at_pot_s"],
                      speedup_at_pot_same_start=q_time / q_at["time_at_pot_s"])
  return dict(problem=f"({m},{n},{k},{gamma:g})", m=m, n=n, k=k, gamma=gamma,
              radix=ot.uses_radix(k, m, jnp.float64, minor_axis=True),
              pot_time_s=p_time, time_s=t_w, first_call_s=t_f, compile_s=t_c,
              speedup=p_time / t_w, pot_iter=p_nit, pot_evals=p_nfev, iter=int(nit),
              evals=int(nev), pot_objective=p_obj, objective=float(val),
              rel_deficit=(p_obj - float(val)) / abs(p_obj), grad_norm=float(gn),
              speedup_at_pot=p_time / at_pot["time_at_pot_s"], **at_pot, **same_start)


def time_to_objective(k, gamma, overrides, args_, target, repeats):
  """Our warm time when stopped (max_iter) at the first iteration whose
  objective reaches `target`. The trace gives a first guess; the traced program
  rounds differently and, on kinks, its iterates drift apart, so the untraced
  run's own objective decides: more iterations until it is >= target."""
  # interior_point=False: the jitted solves timed here are L-BFGS alone, and
  # eager defaults give L-BFGS only 200 iterations where k binds for certain.
  tr = ot.solve(*args_, ot.SparsityConstrained(k=k, gamma=gamma), trace=True,
                interior_point=False, **solve_kwargs(overrides)).trace
  hit = np.flatnonzero(np.asarray(tr.value) >= target)
  it = int(hit[0]) + 1 if hit.size else None
  while it is not None:
    _, _, t_at, (v_at, nit_at, _, _) = time_jax(
        make_solver(k, gamma, {**overrides, "max_iter": it}), args_, repeats)
    if float(v_at) >= target:
      return dict(iter_at_pot=int(nit_at), time_at_pot_s=t_at, objective_at_pot=float(v_at))
    if int(nit_at) < it:   # stopped by its own rule first, below the target
      break
    it += max(2, it // 50)
  return dict(iter_at_pot=-1, time_at_pot_s=float("nan"), objective_at_pot=float("nan"))


def wanted(args, tag):
  """--only: the rows whose label contains one of the strings (all without it)."""
  return not args.only or any(o in tag for o in args.only)


def run(args):
  overrides = {name: getattr(args, name) for name in ("tol", "rtol", "ftol", "max_iter",
                                                      "history")
               if getattr(args, name) is not None}
  rows = []
  grid = GRID[:2] + LARGE_K[:1] if args.quick else GRID + LARGE_K
  header = (f"{'problem':<26}{'POT s':>9}{'ours s':>9}{'1st call s':>11}{'compile s':>10}"
            f"{'speed-up':>9}{'POT it(ev)':>12}{'our it(ev)':>12}{'POT objective':>17}"
            f"{'our objective':>17}{'rel deficit':>12}{'@POT obj: it':>13}{'s':>8}"
            f"{'speed-up':>9}")
  print(header)
  print("-" * len(header))
  for (m, n, k, gamma) in grid:
    if not wanted(args, f"({m},{n},{k},{gamma:g})"):
      continue
    row = solve_row(m, n, k, gamma, overrides, args.repeats)
    rows.append(row)
    print_row(row)
  if any("pot_same_start_time_s" in row for row in rows):
    print_same_start(rows)

  r = ROUTER
  if wanted(args, "router"):
    rows.append(router_row(r, overrides, args))
  sweep = []
  if not args.quick and wanted(args, "sweep"):
    sweep = k_sweep(overrides, args)
  meta = dict(command=" ".join([os.path.basename(sys.executable)] + sys.argv), jax=jax.__version__,
              pot=pot.__version__, dtype="float64", overrides=overrides,
              repeats=args.repeats, cpu_count=os.cpu_count(),
              load_avg=os.getloadavg() if hasattr(os, "getloadavg") else None,
              xla_flags=os.environ.get("XLA_FLAGS", ""))
  print(f"\nours: ot.solve(a, b, C, reg{''.join(f', {k}={v}' for k, v in overrides.items())})"
        f" (semi-dual, L-BFGS), float64; POT {pot.__version__}: smooth_ot_semi_dual "
        f"defaults. load average {meta['load_avg']}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(meta=meta, results=rows, k_sweep=sweep), f, indent=2)
  return rows


def router_row(r, overrides, args):
  """The router batch: one vmap of ours against a POT loop."""
  A, B, Cs = router_problems(r["batch"], r["m"], r["n"])
  p_time, p_objs, p_nits = 0.0, [], []
  n_pot = 8 if args.quick else r["batch"]
  for i in range(n_pot):
    dt, obj, nit, _ = pot_solve(A[i], B[i], Cs[i], r["k"], r["gamma"])
    p_time += dt
    p_objs.append(obj)
    p_nits.append(nit)
  p_time *= r["batch"] / n_pot
  fn = jax.vmap(make_solver(r["k"], r["gamma"], overrides))
  t_c, t_f, t_w, (vals, nits, nevs, gns) = time_jax(
      fn, (jnp.asarray(A), jnp.asarray(B), jnp.asarray(Cs)), args.repeats)
  vals = np.asarray(vals)
  deficits = (np.asarray(p_objs) - vals[:n_pot]) / np.abs(p_objs)
  row = dict(problem=f"router {r['batch']}x({r['m']}x{r['n']},k={r['k']})", m=r["m"],
             n=r["n"], k=r["k"], gamma=r["gamma"], batch=r["batch"], pot_time_s=p_time,
             time_s=t_w, first_call_s=t_f, compile_s=t_c, speedup=p_time / t_w,
             pot_iter=int(np.max(p_nits)), pot_evals=-1, iter=int(np.max(nits)),
             evals=int(np.max(nevs)), pot_objective=float(np.sum(p_objs)),
             objective=float(np.sum(vals[:n_pot])), rel_deficit=float(deficits.max()),
             grad_norm=float(np.max(gns)), pot_problems_timed=n_pot)
  print_row(row)
  return row


def k_sweep(overrides, args):
  """Warm time against k at (5000, 10, k)."""
  sweep = []
  m, n, ks, gamma = K_SWEEP
  print(f"\nk-sweep at ({m},{n},k,{gamma:g}): warm time against k=50")
  for k in ks:
    row = solve_row(m, n, k, gamma, overrides, args.repeats, with_same_start=False)
    sweep.append(row)
    print_row(row)
  base = next(x["time_s"] for x in sweep if x["k"] == 50)
  print("  warm time / time at k=50: " + ", ".join(
      f"k={x['k']}: {x['time_s'] / base:.2f}x" for x in sweep))
  return sweep


def kernels(args):
  """Warm time of one semi-dual evaluation with the k-pass and the radix top-k
  kernels, round-robin, to place the automatic crossover (`ot.uses_radix`).

  Two settings: random costs with a small random alpha (the constraint does not
  bind: the radix path's plain-simplex test skips the selection), and the grid
  problems at the iterate after 150 L-BFGS iterations (near the optimum, where
  k binds on some columns and the selection runs)."""
  from vmoe_sparse_ot.ot import objectives, selection
  rng = np.random.default_rng(0)
  print(f"{'setting':<10}{'m x n':<12}{'dtype':<9}{'k':>5}{'passes ms':>11}{'radix ms':>10}"
        f"{'passes/radix':>14}{'auto':>8}")
  cases = []
  for (m, n) in ((5000, 10), (1000, 1000)):
    for dt in (jnp.float32, jnp.float64):
      C = jnp.asarray(rng.random((m, n)), dt)
      a, b = jnp.full((m,), 1 / m, dt), jnp.full((n,), 1 / n, dt)
      alpha = jnp.asarray(rng.random(m) * 0.01, dt)
      cases += [("random", a, b, C, k, 0.1, alpha) for k in (2, 5, 8, 16, 32, 64, 128)]
  for (m, n, gamma) in ((5000, 10, 0.1), (2000, 64, 1.0), (1000, 1000, 0.1), (500, 500, 0.1),
                        (100, 100, 1.0)):
    a, b, C = (jnp.asarray(v) for v in grid_problem(m, n))
    for k in (2, 5, 8, 16, 32, 48):
      alpha = ot.solve(a, b, C, ot.SparsityConstrained(k=k, gamma=gamma), max_iter=150).alpha
      cases.append(("near-opt", a, b, C, k, gamma, alpha))
  out = []
  for setting, a, b, C, k, gamma, alpha in cases:
    (m, n), dt = C.shape, C.dtype
    fns = {}
    saved = selection._RADIX_MIN_K, selection._RADIX_MIN_K_MINOR
    for name, thr in (("passes", 10 ** 9), ("radix", 1)):
      selection._RADIX_MIN_K = selection._RADIX_MIN_K_MINOR = {4: thr, 8: thr}
      reg = ot.SparsityConstrained(k=k, gamma=gamma)
      # C.T passed in, as `solve` does (transposed once, outside its loop).
      fns[name] = jax.jit(lambda al, a, b, C, C_t, reg=reg: objectives.semi_dual_value_and_grad(
          al, a, b, C, reg, C_t)[:2]).lower(alpha, a, b, C, C.T).compile()
    selection._RADIX_MIN_K, selection._RADIX_MIN_K_MINOR = saved
    times = {name: [] for name in fns}
    C_t = C.T
    for _ in range(args.repeats * 3):
      for name, f in fns.items():
        jax.block_until_ready(f(alpha, a, b, C, C_t))
        t0 = time.perf_counter()
        jax.block_until_ready(f(alpha, a, b, C, C_t))
        times[name].append(time.perf_counter() - t0)
    tp, tr = (min(times[x]) * 1e3 for x in ("passes", "radix"))
    auto = "radix" if ot.uses_radix(k, m, dt, minor_axis=True) else "passes"
    print(f"{setting:<10}{f'{m}x{n}':<12}{jnp.dtype(dt).name:<9}{k:>5}{tp:>11.2f}{tr:>10.2f}"
          f"{tp / tr:>13.2f}x{auto:>8}", flush=True)
    out.append(dict(setting=setting, m=m, n=n, dtype=jnp.dtype(dt).name, k=k, passes_ms=tp,
                    radix_ms=tr, auto=auto))
  print(f"load average {os.getloadavg() if hasattr(os, 'getloadavg') else None}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(kernels=out), f, indent=2)


def print_same_start(rows):
  """POT from our default start (`ot.c_transform_start`) and ours at its objective."""
  print("\nSame start: POT's L-BFGS-B from alpha = ot.c_transform_start(b, C, reg) (ours at its "
        "defaults starts there)")
  header = (f"{'problem':<26}{'POT s':>9}{'POT it(ev)':>12}{'POT objective':>17}"
            f"{'@POT obj: it':>13}{'s':>8}{'speed-up':>9}")
  print(header)
  print("-" * len(header))
  for r in rows:
    if "pot_same_start_time_s" in r:
      print(f"{r['problem']:<26}{r['pot_same_start_time_s']:>9.3f}"
            f"{r['pot_same_start_iter']:>6}({r['pot_same_start_evals']:>4})"
            f"{r['pot_same_start_objective']:>17.10g}{r['iter_at_pot_same_start']:>13}"
            f"{r['time_at_pot_same_start_s']:>8.3f}{r['speedup_at_pot_same_start']:>8.1f}x",
            flush=True)


def print_row(r):
  print(f"{r['problem']:<26}{r['pot_time_s']:>9.3f}{r['time_s']:>9.4f}{r['first_call_s']:>11.2f}"
        f"{r['compile_s']:>10.2f}{r['speedup']:>8.1f}x{r['pot_iter']:>6}({r['pot_evals']:>4})"
        f"{r['iter']:>6}"
        f"({r['evals']:>4}){r['pot_objective']:>17.10g}{r['objective']:>17.10g}"
        f"{r['rel_deficit']:>12.2e}{r.get('iter_at_pot', -1):>13}"
        f"{r.get('time_at_pot_s', float('nan')):>8.3f}"
        f"{r.get('speedup_at_pot', float('nan')):>8.1f}x", flush=True)


def float32_gap(args):
  """float32 solves at the defaults against the float64 optimum (3000 iterations).

  JAX computes in float32 unless x64 is on: this is what `ot.solve` gives a user
  who does not switch it on. Prints the relative gap (f64 - f32) / |f64| of the
  objective, the stop reason, iterations, evaluations, the largest row-marginal
  violation and the float32 solve's wall time (first call, compile included)."""
  print(f"{'problem':<24}{'f64 objective':>17}{'f32 objective':>17}{'rel gap':>10}"
        f"{'f32 stop':>15}{'it(ev)':>12}{'rows off':>10}{'1st call s':>11}")
  for (m, n, k, gamma) in GRID + LARGE_K:
    label = f"({m},{n},{k},{gamma:g})"
    if not wanted(args, label):
      continue
    a, b, C = grid_problem(m, n)
    reg = ot.SparsityConstrained(k=k, gamma=gamma)
    # float(): the reference must have finished before the clock starts.
    f64 = float(ot.solve(jnp.asarray(a), jnp.asarray(b), jnp.asarray(C), reg,
                         max_iter=3000).value)
    a32, b32, C32 = (jnp.asarray(v, jnp.float32) for v in (a, b, C))
    t0 = time.perf_counter()
    res = jax.block_until_ready(ot.solve(a32, b32, C32, reg))
    dt = time.perf_counter() - t0
    f32 = float(res.value)
    rows_off = float(jnp.max(jnp.abs(res.plan.sum(axis=1) - a32)))
    print(f"{label:<24}{f64:>17.10g}{f32:>17.10g}{(f64 - f32) / abs(f64):>10.2e}"
          f"{res.reason():>15}{f'{int(res.num_iter)}({int(res.num_evals)})':>12}"
          f"{rows_off:>10.2e}{dt:>11.2f}", flush=True)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--json", help="also write the figures to this JSON file")
  p.add_argument("--repeats", type=int, default=5, help="warm runs per problem (best of; POT too)")
  p.add_argument("--tol", type=float, default=None, help="override solve's tol")
  p.add_argument("--max-iter", dest="max_iter", type=int, default=None,
                 help="override solve's max_iter")
  p.add_argument("--ftol", type=float, default=None, help="override solve's ftol")
  p.add_argument("--rtol", type=float, default=None, help="override solve's rtol")
  p.add_argument("--history", type=int, default=None, help="override solve's history")
  p.add_argument("--only", action="append", default=[], metavar="TEXT",
                 help="run only the rows whose label contains TEXT (repeatable), e.g. "
                 "'(10000,100', 'router', 'sweep'")
  p.add_argument("--threads", default=None,
                 help="XLA CPU intra-op threads (1: single; with `taskset -c 0` the run is "
                 "reproducible to a few percent, where two threads on this 2-core machine "
                 "vary 2-3x between processes)")
  p.add_argument("--kernels", action="store_true", help="only the top-k kernel crossover")
  p.add_argument("--float32", action="store_true",
                 help="only float32 solves at the defaults against the float64 optimum")
  p.add_argument("--quick", action="store_true", help="small grid, 8 POT router problems")
  args = p.parse_args(argv)
  if args.kernels:
    kernels(args)
  elif args.float32:
    float32_gap(args)
  else:
    run(args)


if __name__ == "__main__":
  main()
