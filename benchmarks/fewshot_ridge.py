"""Time of one few-shot ridge fit over the 30-strength L2 grid, vs. a solve per strength.

`ridge.fit` (one eigendecomposition, closed-form leave-one-out for every strength,
refit at the chosen one) against the naive baseline: `np.linalg.solve` of the
(p x p) normal equations for each of the 30 strengths (which does not even select
the strength). Features are random, standardised inside the fit; timings are the
best of `--repeats` runs, host numpy float64.

    python benchmarks/fewshot_ridge.py [--classes 100] [--shots 1,5,10,25] [--dim 768]
"""
import argparse
import time

import numpy as np

from vmoe_sparse_ot.evaluate import ridge

L2_REGS = tuple(2.0**k for k in range(-10, 20))


def best_time(fn, repeats):
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--classes', type=int, default=100)
  parser.add_argument('--shots', default='1,5,10,25')
  parser.add_argument('--dim', type=int, default=768)
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  print(f'classes={args.classes} dim={args.dim} L2 strengths={len(L2_REGS)}')
  print(f'{"shots":>5} {"n":>6} {"form":>7} {"ridge.fit (s)":>14} {"30 solves (s)":>14}')
  for shot in (int(s) for s in args.shots.split(',')):
    n = shot * args.classes
    x = rng.normal(size=(n, args.dim))
    labels = np.repeat(np.arange(args.classes), shot)
    fit_time = best_time(lambda: ridge.fit(x, labels, num_classes=args.classes,
                                           l2_regs=L2_REGS), args.repeats)
    design = ridge.design_matrix(x, *ridge.standardization(x))
    y = ridge.one_hot_pm1(labels, args.classes)

    def solves():
      gram, rhs = design.T @ design, design.T @ y
      for lam in L2_REGS:
        np.linalg.solve(gram + lam * np.eye(gram.shape[0]), rhs)
    solve_time = best_time(solves, args.repeats)
    form = 'primal' if args.dim + 1 <= n else 'kernel'
    print(f'{shot:>5} {n:>6} {form:>7} {fit_time:>14.3f} {solve_time:>14.3f}')


if __name__ == '__main__':
  main()
