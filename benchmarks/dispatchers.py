"""Step time of the dispatchers side by side: 'dropless' against 'indices' and 'einsum'.

Two parts, one run, round-robin (`--rounds` rounds of `--steps` steps each, the
best round's mean reported; load from other processes hits the dispatchers alike):

- tiny: the train step (forward, backward, Adam update) of configs/vmoe_tiny_mnist.py's
  model (TopK, E = 8, K = 2, S = 64, C = 16: capacity factor 1) at its batch of 128;
- b32: one MoE layer, forward + backward with respect to its parameters and its input,
  at the paper's B/32 router and expert shapes (D 768, MLP 3072, S = 400, E = 32,
  K = 2, capacity factor 1.05: C = 28) on `--b32_batch` images of 50 tokens (8: one
  group of 400).

`indices` and `einsum` drop the choices over capacity; `dropless` serves them all,
so it computes more expert rows when the load is uneven, and on the CPU it pads each
expert's rows to whole blocks (`nn.dropless.block_matmul`). Ratios are printed
against `indices` (the default dispatcher) and `einsum`.

    python benchmarks/dispatchers.py --threads 1 --clock cpu [--b32_batch 8] [--json out.json]
"""
import argparse
import json
import os
import time

import xla_threads  # noqa: E402  (the benchmarks folder is sys.path[0])

xla_threads.from_argv()  # before JAX starts

import jax
import jax.numpy as jnp
import optax

from vmoe_sparse_ot import config as config_lib
from vmoe_sparse_ot import nn as vnn
from vmoe_sparse_ot.nn.moe import MoeLayer
from routers import make_step, time_round_robin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DISPATCHERS = ("indices", "einsum", "dropless")


def tiny_calls(args):
  """{dispatcher: warm call(i)} of the tiny config's train step."""
  config = config_lib.load_config_file(os.path.join(ROOT, "configs", "vmoe_tiny_mnist.py") + ":router=topk")
  images = jax.random.normal(jax.random.key(0), (config.batch_size, 28, 28, 1))
  labels = jnp.zeros((config.batch_size,), jnp.int32)
  calls = {}
  for name in DISPATCHERS:
    config.model.encoder.moe.dispatcher = name
    model = vnn.build_model(config.model)
    params = jax.jit(lambda k, m=model: m.init({"params": k}, images, train=False))(
        jax.random.key(1))["params"]
    tx = optax.adam(1e-3)
    step = make_step(model, tx)
    state = [params, tx.init(params)]

    def call(i, step=step, state=state):
      state[0], state[1], loss = step(state[0], state[1], images, labels, jax.random.key(i))
      return loss
    calls[name] = call
  return calls


def b32_calls(args):
  """{dispatcher: warm call(i)} of one MoE layer's forward + backward at the B/32 shapes."""
  d, h, s, e = 768, 3072, 400, 32
  router = vnn.parse_router_options({"name": "topk", "num_selected_experts": 2,
                                     "capacity_factor": 1.05})
  x = jax.random.normal(jax.random.key(0), (args.b32_batch, 50, d))
  ct = jax.random.normal(jax.random.key(1), x.shape)
  calls = {}
  for name in DISPATCHERS:
    layer = MoeLayer(num_experts=e, mlp_dim=h, group_size=s, router=router, dispatcher=name)
    params = jax.jit(lambda k, l=layer: l.init(k, x, train=False))(jax.random.key(2))["params"]

    @jax.jit
    def grads(p, x, rng, layer=layer):
      def loss(p, x):
        y, aux, _ = layer.apply({"params": p}, x, train=True, rngs={"gating": rng})
        return jnp.sum(y * ct) + aux
      return jax.grad(loss, argnums=(0, 1))(p, x)

    calls[name] = lambda i, g=grads, p=params: g(p, x, jax.random.key(i))
  return calls


def run(part, calls, args, clock):
  for call in calls.values():
    for i in range(args.warmup):
      jax.block_until_ready(call(i))
  times = time_round_robin(calls, args.rounds, args.steps, clock)
  best = {name: min(t) for name, t in times.items()}
  print(f"{part}: best round's mean step, {jax.devices()[0].platform}, "
        f"threads={args.threads or 'default'}, clock={args.clock}")
  for name in DISPATCHERS:
    print(f"  {name:9s} {best[name] * 1e3:9.1f} ms   {best[name] / best['indices']:.2f}x indices"
          f"   {best[name] / best['einsum']:.2f}x einsum", flush=True)
  return {name: {"best_ms": best[name] * 1e3, "rounds_ms": [t * 1e3 for t in times[name]]}
          for name in DISPATCHERS}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--parts", default="tiny,b32")
  p.add_argument("--b32_batch", type=int, default=8, help="images of 50 tokens (G = 50 B / 400)")
  p.add_argument("--steps", type=int, default=2)
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--warmup", type=int, default=1)
  p.add_argument("--threads", default=None, help="XLA CPU intra-op threads (1: single)")
  p.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                 help="wall time, or this process's CPU time (steadier on a shared machine; "
                      "use with --threads 1)")
  p.add_argument("--json", default=None, help="also write the results here")
  args = p.parse_args(argv)
  clock = time.process_time if args.clock == "cpu" else time.perf_counter
  parts = {"tiny": tiny_calls, "b32": b32_calls}
  results = {part: run(part, parts[part](args), args, clock)
             for part in args.parts.split(",")}
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
