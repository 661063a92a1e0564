"""Two accelerator probes, each line printed as soon as it is measured (a run cut
off by its time limit keeps what it printed).

--part pallas: the router's solve alone at the paper's B/32 routing shapes
  (expert choice, G groups of S tokens x E experts, k nonzeros per expert
  column, 50 Adam steps, the router's costs 1 - softmax of random logits):
  'fast' (ot.batched_semi_dual_adam) against the fused kernel
  (ot.batched_semi_dual_adam_pallas) at several Triton warp counts (1-16), forward only
  (the router stops the gradient before the solve), jitted and warm, best of
  --repeats; with each kernel's largest plan difference from 'fast'. Says which
  warp count to use and whether the kernel beats 'fast' on this device.

--part ot: where the time of `ot.solve` goes at (m, n, k, gamma) = (10000, 100,
  100, 0.1) in float64 (benchmarks/ot_solvers.py's row that printed nothing on a
  GPU in 230 s): the column top-k that an evaluation runs (the radix selection
  against `lax.top_k`), one semi-dual evaluation (value + gradient), a jitted solve
  with max_iter 100, then the defaults (1000 iterations), each first call
  (compile + run) and warm.

    python benchmarks/gpu_probe.py --part pallas [--groups 512]
    python benchmarks/gpu_probe.py --part ot
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

import ot_problems  # (the benchmarks folder is sys.path[0])


def _timed(fn, args, repeats):
  """(first call s, best warm s, output)."""
  t0 = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  first = time.perf_counter() - t0
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - t0)
  return first, best, out


def pallas_part(args, record):
  from vmoe_sparse_ot import ot  # pylint: disable=g-import-not-at-top
  g, s, e, k = args.groups, args.group_size, args.experts, args.k
  logits = jax.random.normal(jax.random.key(0), (g, s, e), jnp.float32)
  cost = 1.0 - jax.nn.softmax(logits, axis=-1)
  a = jnp.ones((g, s), jnp.float32)
  b = jnp.full((g, e), s / e, jnp.float32)
  print(f"router solve alone: G={g}, S={s}, E={e}, k={k}, 50 Adam steps, float32, "
        f"{jax.devices()[0].device_kind}, JAX {jax.__version__}", flush=True)
  fast = jax.jit(lambda c, a, b: ot.batched_semi_dual_adam(c, a, b, k, 1.0, 50, 1e-2))
  first, best, ref = _timed(fast, (cost, a, b), args.repeats)
  print(f"{'fast':<14} first {first:7.2f} s   warm {1e3 * best:8.3f} ms", flush=True)
  record["fast_ms"] = 1e3 * best
  for warps in args.warps:
    fn = jax.jit(lambda c, a, b, w=warps: ot.batched_semi_dual_adam_pallas(
        c, a, b, k, 1.0, 50, 1e-2, interpret=False if args.compiled else None, num_warps=w))
    try:
      first, best, plan = _timed(fn, (cost, a, b), args.repeats)
    except Exception as err:  # pylint: disable=broad-except
      print(f"pallas w={warps:<4} FAILED: {type(err).__name__}: {str(err).splitlines()[0][:300]}",
            flush=True)
      record[f"pallas_w{warps}"] = f"failed: {type(err).__name__}"
      continue
    diff = float(jnp.max(jnp.abs(plan - ref)))
    print(f"pallas w={warps:<4} first {first:7.2f} s   warm {1e3 * best:8.3f} ms   "
          f"vs fast {best * 1e3 / record['fast_ms']:5.2f}x   max |plan - fast's| {diff:.2e}",
          flush=True)
    record[f"pallas_w{warps}_ms"] = 1e3 * best
    record[f"pallas_w{warps}_maxdiff"] = diff


def ot_part(args, record):
  jax.config.update("jax_enable_x64", True)
  from vmoe_sparse_ot import ot  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.ot import objectives, selection  # pylint: disable=g-import-not-at-top
  m, n, k, gamma = 10000, 100, 100, 0.1
  a, b, C = (jnp.asarray(v) for v in ot_problems.grid_problem(m, n))
  rng = np.random.RandomState(1)
  reg = ot.SparsityConstrained(k=k, gamma=gamma)
  print(f"ot.solve at ({m}, {n}, k={k}, gamma={gamma}), float64, "
        f"{jax.devices()[0].device_kind}, JAX {jax.__version__}", flush=True)
  # The column top-k an evaluation runs ((n, m) layout, k along the contiguous axis):
  # the radix selection (a while loop of digit passes) against XLA's own top_k.
  u = jnp.asarray(rng.randn(n, m))
  for name, fn in (("radix selection (threshold_top_k_mask)",
                    lambda x: selection.threshold_top_k_mask(x, k, axis=-1)),
                   ("lax.top_k", lambda x: lax.top_k(x, k)[0])):
    first, best, _ = _timed(jax.jit(fn), (u,), args.repeats)
    print(f"top-{k} of each of {n} rows of {m}, {name}: first {first:.2f} s, "
          f"warm {1e3 * best:.3f} ms", flush=True)
    record[f"top_k_ms:{name}"] = 1e3 * best
  alpha = ot.c_transform_start(b, C, reg)
  evaluate = jax.jit(lambda al, a, b, C: objectives.semi_dual_value_and_grad(al, a, b, C, reg)[:2])
  first, best, _ = _timed(evaluate, (alpha, a, b, C), args.repeats)
  print(f"one evaluation (value + gradient): first {first:.2f} s, warm {1e3 * best:.3f} ms",
        flush=True)
  record["evaluation_ms"] = 1e3 * best
  for max_iter in (100, None):
    kw = {} if max_iter is None else {"max_iter": max_iter}
    solve = jax.jit(lambda a, b, C, kw=kw: (lambda r: (r.value, r.num_iter, r.num_evals))(
        ot.solve(a, b, C, reg, **kw)))
    first, best, (value, iters, evals) = _timed(solve, (a, b, C), 1)
    label = f"max_iter {max_iter}" if max_iter else "defaults"
    print(f"jit(ot.solve), {label}: first {first:.2f} s, warm {best:.3f} s, "
          f"{int(iters)} iterations ({int(evals)} evaluations), "
          f"{1e3 * best / max(int(evals), 1):.3f} ms per evaluation, objective {float(value):.10g}",
          flush=True)
    record[f"solve_{label.replace(' ', '_')}"] = {"first_s": first, "warm_s": best,
                                                  "iterations": int(iters),
                                                  "evaluations": int(evals)}


def warp_counts(text: str) -> list[int]:
  return [int(w) for w in text.split(",")]


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--part", required=True, choices=("pallas", "ot"))
  p.add_argument("--groups", type=int, default=512)
  p.add_argument("--group_size", type=int, default=400)
  p.add_argument("--experts", type=int, default=32)
  p.add_argument("--k", type=int, default=16)
  p.add_argument("--warps", type=warp_counts, default=[4, 8, 16],
                 help="comma-separated Triton warp counts, e.g. 4,8,16")
  p.add_argument("--compiled", action="store_true",
                 help="never Pallas interpret mode (default: interpret on the CPU only)")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--json", default=None, help="also write the figures here")
  args = p.parse_args(argv)
  record = {"part": args.part, "device": jax.devices()[0].device_kind, "jax": jax.__version__}
  try:
    (pallas_part if args.part == "pallas" else ot_part)(args, record)
  finally:
    if args.json:
      with open(args.json, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
  main()
