"""`batched_semi_dual`: the one entry point for many small sparsity-constrained semi-duals.

The MoE router's problems, G at once: per group, costs (m, n), row masses a,
column masses b, at most k nonzeros per column, squared-L2 strength gamma. Two
solvers, each with its paths:

- "newton" (the default): damped semi-smooth Newton (`newton`), at most
  `max_steps` = 10 gradient evaluations per group, each group stopping on its
  own rule. On the router's B/32 problems it matches Adam-50's semi-dual gap and
  row-mass error (benchmarks/RESULTS.md, "The router's solvers").
- "adam": the paper's solver, Adam from alpha = 0 for a fixed `max_steps`
  (50 in the paper) at `learning_rate`, through one of its paths -- the same
  iterates up to rounding: 'fast' (`batched.batched_semi_dual_adam`),
  'candidates' (`candidates.batched_semi_dual_adam_candidates`), 'pallas'
  (`pallas_solve.batched_semi_dual_adam_pallas`, one fused kernel per group);
  'auto' picks by shapes and backend (`adam_path`).

No gradient flows through any of them (the inputs are taken through
`lax.stop_gradient`). Half precision is solved in float32 (`ot.precision`).
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax import lax

from vmoe_sparse_ot.ot import batched
from vmoe_sparse_ot.ot import candidates
from vmoe_sparse_ot.ot import newton
from vmoe_sparse_ot.ot import pallas_solve
from vmoe_sparse_ot.ot import precision

Array = jax.Array

SOLVERS = ("newton", "adam")
ADAM_PATHS = ("auto", "fast", "candidates", "pallas")
# Each solver's step cap when max_steps is None: Newton's (chosen by measurement)
# and the paper's 50 Adam steps.
DEFAULT_STEPS = {"newton": newton.DEFAULT_MAX_STEPS, "adam": 50}
DEFAULT_LEARNING_RATE = 1e-2


class BatchedSemiDualResult(NamedTuple):
  """plan (G, m, n), at most k nonzeros per column; alpha (G, m), the final
  iterate; steps (G,) int32, the gradient evaluations each group used (Adam: its
  fixed count); converged (G,) bool, whether the group met its solver's stop rule
  within the cap (Adam has none: True, it ran the steps asked, as `ot.solve`'s
  "fixed_iter")."""
  plan: Array
  alpha: Array
  steps: Array
  converged: Array


def adam_path(m: int, n: int, k: int, backend: str) -> str:
  """The Adam path 'auto' runs for problems of m rows and n columns, at most k
  nonzeros per column, on `backend`.

  CPU: the rule fits the router-alone grid of benchmarks/RESULTS.md ("sparse_ot's
  paths side by side", 2026-11-27, JAX 0.10.2): it picks the faster path at all
  25 of its shapes. 'candidates' wins where k is large (each step of 'fast' costs
  about k passes over the group: k >= 20 with m >= 3k) or the groups are long
  with many experts (m >= 320 with n >= 32), and loses elsewhere at k <= 16; it
  needs 2k < m (`candidates.applies`).
  GPU and other backends: 'fast'. 'candidates' lost on an H200 at the B/32
  shapes; the fused kernel ('pallas') was faster alone there but not yet shown
  faster in a train step (RESULTS.md), so it is opt-in.
  """
  if backend != "cpu" or not 2 * k < m:
    return "fast"
  if (k >= 20 and m >= 3 * k) or (n >= 32 and m >= 320):
    return "candidates"
  return "fast"


def _mask_padding(C: Array, a: Array, b: Array, gamma) -> Array:
  """C with the rows of zero mass at a cost no real row's value falls below.

  A row's value in column j is (alpha_i - C_ij) / gamma; a padding row's alpha
  stays 0 (its gradient is 0 - 0), and a real row's alpha moves by at most
  about the costs' span plus gamma times the largest column mass. Four times
  both above the largest real cost keeps padding out of every top k.
  """
  real = (a > 0)[..., None]
  c_max = jnp.max(jnp.where(real, C, -jnp.inf), axis=(1, 2), keepdims=True)
  c_min = jnp.min(jnp.where(real, C, jnp.inf), axis=(1, 2), keepdims=True)
  c_max, c_min = (jnp.where(jnp.isfinite(x), x, 0) for x in (c_max, c_min))
  reach = 4 * (c_max - c_min) + 4 * gamma * (jnp.max(b, axis=1)[:, None, None] + 1)
  return jnp.where(real, C, c_max + reach)


def _check(C, a, b, k, solver, max_steps, implementation) -> None:
  if C.ndim != 3:
    raise ValueError(f"C must be (G, m, n), got shape {C.shape}")
  if a.shape != C.shape[:2] or b.shape != C.shape[:1] + C.shape[2:]:
    raise ValueError(f"a must be (G, m) and b (G, n) for C {C.shape}, got a {a.shape}, "
                     f"b {b.shape}")
  if not isinstance(k, int) or k < 1:
    raise ValueError(f"k must be an int >= 1, got {k!r}")
  if solver not in SOLVERS:
    raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}")
  if max_steps is not None and (not isinstance(max_steps, int) or max_steps < 1):
    raise ValueError(f"max_steps must be an int >= 1 or None, got {max_steps!r}")
  if implementation not in ADAM_PATHS:
    raise ValueError(f"implementation must be one of {ADAM_PATHS}, got {implementation!r}")


def batched_semi_dual(C: Array, a: Array, b: Array, k: int, gamma=1.0, *,
                      solver: str = "newton", max_steps: Optional[int] = None,
                      tol=newton.DEFAULT_TOL, learning_rate=DEFAULT_LEARNING_RATE,
                      implementation: str = "auto") -> BatchedSemiDualResult:
  """G sparsity-constrained semi-duals, each with at most k nonzeros per plan column.

  Args:
    C: (G, m, n) finite costs (any sign; C + const gives the same plans).
    a: (G, m) row masses; b: (G, n) column masses, each group's totals equal.
      Rows or columns of mass 0 are padding: they get no mass (a padding row's
      costs are replaced by one above every real row's reach, `_mask_padding`),
      and the others' plans are those of the problem without them.
    k: static int >= 1, at most k nonzeros per column (k >= m: no constraint).
    gamma: > 0, the squared-L2 strength (may be traced).
    solver: "newton" (default) or "adam" (module docstring).
    max_steps: static cap on gradient evaluations per group; None: the solver's
      default (`DEFAULT_STEPS`: 10 for Newton, the paper's 50 for Adam).
    tol: Newton's stop rule (`newton` module docstring); 0 runs max_steps.
    learning_rate: Adam's step size (the paper's 1e-2).
    implementation: Adam's path, "auto" (default; `adam_path`), "fast",
      "candidates" or "pallas". Newton has one path.

  Returns:
    `BatchedSemiDualResult` (plan, alpha, steps, converged), in C's dtype
    (float32 for half-precision inputs).

  Raises:
    ValueError: naming the argument, for shapes that do not match or an
      unknown solver or implementation.
  """
  C, a, b = (jnp.asarray(x) for x in (C, a, b))
  _check(C, a, b, k, solver, max_steps, implementation)
  C, a, b = (lax.stop_gradient(x) for x in precision.upcast((C, a, b)))
  C = _mask_padding(C, a, b, gamma)
  g, m, n = C.shape
  steps = DEFAULT_STEPS[solver] if max_steps is None else max_steps
  if solver == "newton":
    res = newton.batched_semi_dual_newton(C, a, b, k, gamma, max_steps=steps, tol=tol)
    return BatchedSemiDualResult(*res)
  path = implementation
  if path == "auto":
    path = adam_path(m, n, k, jax.default_backend())
  if path == "fast":
    plan, alpha = batched.batched_semi_dual_adam(C, a, b, k, gamma, steps, learning_rate,
                                                 return_alpha=True)
  elif path == "candidates":
    plan, alpha = candidates.batched_semi_dual_adam_candidates(
        C, a, b, k, gamma, steps, learning_rate, return_alpha=True)
  else:
    plan, alpha = pallas_solve.batched_semi_dual_adam_pallas(
        C, a, b, k, gamma, steps, learning_rate, return_alpha=True)
  return BatchedSemiDualResult(plan=plan, alpha=alpha,
                               steps=jnp.full((g,), steps, jnp.int32),
                               converged=jnp.ones((g,), bool))
