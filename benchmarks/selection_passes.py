"""How many selection passes the fused kernel's two selections make per Adam step.

The kernel (`ot.batched_semi_dual_adam_pallas`) runs a group's columns in
lockstep, so a step costs what its slowest column needs. On the router's problem
of `benchmarks/gpu_probe.py --part pallas` (costs 1 - softmax of N(0, 1) logits,
G groups of S tokens x E experts, k members per expert, 50 Adam steps from 0,
gamma 1, learning rate 1e-2), this replays the iterates with an exact top-k
(`lax.top_k`) and counts, per group and step:

- selection="passes": k passes, each a max and an argmax (2 reductions);
- selection="incremental": |count - k| passes (count: the entries ranked at or
  above the previous step's k-th; a max and a max of positions each), the count
  itself and the new k-th entry (a min and a max of positions), and Michelot's
  rounds for the threshold (3 reductions each: a sum, a count, the kept count),
  each the largest over the group's E columns.

Reductions stand in for time: on a GPU each is a round trip through shared
memory and a barrier when it crosses warps. No GPU needed (XLA on the host):

    python benchmarks/selection_passes.py [--groups 64] [--seeds 0,1]
"""
import argparse

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

from vmoe_sparse_ot.ot import optim


def replay(seed, g, s, e, k, steps, lr=1e-2):
  """Per step: u (T, G, S, E) and each column's k-th value and position (T, G, E)."""
  logits = jax.random.normal(jax.random.key(seed), (g, s, e), jnp.float32)
  cost = 1.0 - jax.nn.softmax(logits, axis=-1)
  a, b = jnp.ones((g, s), jnp.float32), jnp.full((g, e), s / e, jnp.float32)

  def project(u):
    values, rows = lax.top_k(jnp.swapaxes(u, 1, 2), k)       # (G, E, k): value, then row
    tau = jnp.max((jnp.cumsum(values, -1) - b[..., None]) / jnp.arange(1, k + 1), -1)
    t = jnp.maximum(values - tau[..., None], 0)
    plan = jnp.zeros((g, e, s), u.dtype).at[
        jnp.arange(g)[:, None, None], jnp.arange(e)[None, :, None], rows].set(t)
    return jnp.swapaxes(plan, 1, 2), values, rows

  def step(carry, i):
    alpha, mu, nu = carry
    u = alpha[:, :, None] - cost
    plan, values, rows = project(u)
    alpha, mu, nu = optim.adam_update(i, alpha, mu, nu, a - plan.sum(-1), lr)
    return (alpha, mu, nu), (u, values, rows)

  zeros = jnp.zeros((g, s), jnp.float32)
  _, (u, values, rows) = jax.jit(lambda: lax.scan(step, (zeros, zeros, zeros),
                                                  jnp.arange(steps)))()
  return np.asarray(u), np.asarray(values), np.asarray(rows), np.asarray(b)


def michelot_rounds(members, mass):
  """Rounds of Michelot's rule until no member drops: members (..., k), mass (...)."""
  support = np.ones(members.shape, bool)
  rounds = np.zeros(members.shape[:-1], int)
  active = np.ones(members.shape[:-1], bool)
  while active.any():
    rounds += active
    tau = (np.where(support, members, 0).sum(-1) - mass) / support.sum(-1)
    kept = support & (members > tau[..., None])
    active &= (kept.sum(-1) < support.sum(-1)) & (kept.sum(-1) > 0)
    support = np.where(active[..., None], kept, support)
  return rounds


def count(seed, g, s, e, k, steps):
  u, values, rows, b = replay(seed, g, s, e, k, steps)
  kth, kth_row = values[..., -1], rows[..., -1]                       # (T, G, E)
  position = np.arange(s)[None, None, :, None]
  at_or_above = (u[1:] > kth[:-1, :, None]) | (
      (u[1:] == kth[:-1, :, None]) & (position <= kth_row[:-1, :, None]))
  moves = np.abs(at_or_above.sum(2) - k)                              # (T - 1, G, E)
  moves = np.concatenate([np.full((1, g, e), k), moves])              # the first step: k
  rounds = michelot_rounds(values, b)                                 # (T, G, E)
  group_moves, group_rounds = moves.max(-1), rounds.max(-1)           # lockstep: (T, G)
  return {"passes": 2 * k, "moves": group_moves, "rounds": group_rounds,
          "incremental": 1 + 2 * group_moves + 2 + 3 * group_rounds}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--groups", type=int, default=64)
  p.add_argument("--group_size", type=int, default=400)
  p.add_argument("--experts", type=int, default=32)
  p.add_argument("--k", type=int, default=16)
  p.add_argument("--steps", type=int, default=50)
  p.add_argument("--seeds", type=lambda text: [int(x) for x in text.split(",")],
                 default=[0, 1], help="comma-separated seeds of the logits")
  args = p.parse_args(argv)
  print(f"G={args.groups}, S={args.group_size}, E={args.experts}, k={args.k}, "
        f"{args.steps} Adam steps; per group and step, the largest over its columns")
  print(f"{'seed':>4} {'moves mean':>10} {'p90':>4} {'max':>4} {'Michelot rounds mean':>20} "
        f"{'max':>4} {'reductions: passes':>18} {'incremental':>11} {'ratio':>6}")
  for seed in args.seeds:
    c = count(seed, args.groups, args.group_size, args.experts, args.k, args.steps)
    later = c["moves"][1:]       # after the first step, which makes k either way
    inc = c["incremental"].mean()
    print(f"{seed:>4} {later.mean():>10.2f} {np.percentile(later, 90):>4.0f} "
          f"{later.max():>4d} {c['rounds'].mean():>20.2f} {c['rounds'].max():>4d} "
          f"{c['passes']:>18d} {inc:>11.1f} {c['passes'] / inc:>5.1f}x")


if __name__ == "__main__":
  main()
