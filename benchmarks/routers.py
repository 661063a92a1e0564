"""Train-step time of a small V-MoE per router, and of the dense ViT, in one run.

One step = forward, backward and an optax Adam update, jitted and warm (compiled
and run `--warmup` times first). Models are timed round-robin (`--rounds` rounds
of `--steps` steps each) so that load from other processes hits them alike; the
reported time per model is the best round's mean step time (and the median round's).

    python benchmarks/routers.py [--batch 128] [--json out.json]

With --router-only, times just each router instead (forward and backward of
`routers.route` on random logits of the router's shape -- (G, S, E), or
(G, S, E, C) for soft_moe -- G = batch * tokens / S, the groups one MoE layer
routes), the same round-robin way. The paper's B/32 router shapes (S = 400,
E = 32, K = 2, C = 28, k = 16, G = 16 at batch 128):

    python benchmarks/routers.py --router-only --image 224 --patch 32 --group_size 400 \
        --experts 32 --capacity_factor 1.05 --k 16

Router names may carry a sparse_ot solver or Adam path ('sparse_ot:newton', the
default solver; 'sparse_ot:fast', 'sparse_ot:candidates', ...: the paper's Adam-50
through that path), to compare them in one run
('pallas': the fused kernel, for a GPU; on the CPU it runs in Pallas interpret
mode, a correctness check only, far slower):

    python benchmarks/routers.py --router-only --routers topk,sparse_ot:fast,sparse_ot:candidates ...

A router that fails to build or compile (e.g. a kernel that does not lower on
this backend) is reported in one line and left out; the others are still timed.

With --grid, times the routers alone the same way at each of a grid of routing
shapes ("S:E:k" or "S:E:k:token_choice"; G = ceil(--tokens / S) groups), one
row per shape with the paths side by side, and the path that
`implementation='auto'` picks there (the table behind its rule):

    python benchmarks/routers.py --grid default --threads 1 --clock cpu

The model run also times each router alone at the model's routing shapes (G =
ceil(batch * tokens / S) groups, forward + backward of `routers.route`, in the
same round-robin) and prints the router's share of the step: its time times the
number of MoE layers over the model's step time (an estimate: inside the step XLA
fuses the router with its neighbours).

Targets (issue 3): sparse_ot <= 1.10x topk; topk MoE <= 1.25x dense ViT.
"""
import argparse
import functools
import json
import statistics
import time

import xla_threads  # noqa: E402  (the benchmarks folder is sys.path[0])

xla_threads.from_argv()  # before JAX starts

import jax
import jax.numpy as jnp
import optax

from vmoe_sparse_ot import nn as vnn
from vmoe_sparse_ot.nn import routers as vrouters
from vmoe_sparse_ot.nn.model_config import default_model_config, default_router_config


def pallas_kernel(spec: str) -> str:
  """`spec`, checked: the fused kernel as "VARIANT:WARPS" (e.g. "nm-reload:8"; the
  variants of gpu_probe.VARIANTS)."""
  _pallas_kernel_args(spec)
  return spec


def _pallas_kernel_args(spec: str) -> dict:
  import gpu_probe  # pylint: disable=g-import-not-at-top  (the benchmarks folder is sys.path[0])
  variant, _, warps = spec.partition(":")
  try:
    if not warps.isdigit():
      raise ValueError(f"no warp count after {variant!r}")
    return gpu_probe.kernel_args(variant, int(warps))
  except ValueError as e:
    raise argparse.ArgumentTypeError(
        f"expected VARIANT:WARPS, e.g. nm-reload:8, got {spec!r} ({e})") from None


def use_pallas_kernel(spec: str) -> None:
  """Makes sparse_ot's fused kernel ('pallas') run as `spec` (`pallas_kernel`) in this
  process: the router calls `ot.batched_semi_dual_adam_pallas` through the `ot`
  module, so that name is rebound with the kernel's arguments fixed."""
  from vmoe_sparse_ot import ot  # pylint: disable=g-import-not-at-top
  ot.batched_semi_dual_adam_pallas = functools.partial(ot.batched_semi_dual_adam_pallas,
                                                       **_pallas_kernel_args(spec))


def make_config(args, name: str, router: str = "topk", mlp_dim=None):
  cfg = default_model_config()
  cfg.name = name
  cfg.num_classes = 10
  cfg.patch_size = (args.patch, args.patch)
  cfg.hidden_size = args.hidden
  cfg.encoder.num_layers = args.layers
  cfg.encoder.num_heads = args.heads
  cfg.encoder.mlp_dim = mlp_dim or args.mlp
  cfg.encoder.moe.num_experts = args.experts
  cfg.encoder.moe.group_size = args.group_size
  cfg.encoder.moe.dispatcher = args.dispatcher
  set_router_options(cfg.encoder.moe.router, args, router)
  return cfg


def set_router_options(router_cfg, args, name: str) -> None:
  """`name` is a router's name, "sparse_ot:newton" (its default solver), or
  "sparse_ot:IMPLEMENTATION" (e.g. "sparse_ot:candidates") to time one of the
  paths of its Adam solver (the paper's 50 steps)."""
  name, _, implementation = name.partition(":")
  if implementation == "newton":
    router_cfg.sparse_ot.solver, implementation = "newton", ""
  elif implementation:
    router_cfg.sparse_ot.solver = "adam"
  router_cfg.name = name
  router_cfg.capacity_factor = args.capacity_factor
  router_cfg.sparse_ot.k = args.k
  if getattr(args, "form", None):
    router_cfg.sparse_ot.form = args.form
  if implementation:
    router_cfg.sparse_ot.implementation = implementation
  if name == "expert_choice":
    # Expert choice counts C from S/E (no K, as the reference V-MoE): factor K keeps its
    # buffers the size of the token-choice routers', and no gate noise, as when
    # RESULTS.md was measured.
    router_cfg.capacity_factor = args.capacity_factor * router_cfg.num_selected_experts
    router_cfg.noise_std = 0.0


def make_step(model, tx, model_state=None):
  """A train step; a stateful router (topk_bias) routes with the fixed `model_state`
  (its once-per-step update costs a few (E,) operations, left out)."""
  def loss_fn(params, images, labels, rng):
    k1, k2 = jax.random.split(rng)
    logits, aux = model.apply({"params": params, **(model_state or {})}, images, train=True,
                              rngs={"dropout": k1, "gating": k2})
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return loss + aux["auxiliary_loss"]

  @jax.jit
  def step(params, opt_state, images, labels, rng):
    loss, grads = jax.value_and_grad(loss_fn)(params, images, labels, rng)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return step


def make_router_step(name: str, groups: int, args):
  """Jitted forward + backward of one router on its logits; returns (fn, args)."""
  cfg = default_router_config()
  set_router_options(cfg, args, name)
  parsed = vrouters.parse_router_options(cfg)
  router = vrouters.get_router(cfg.name)
  s, e = args.group_size, args.experts
  capacity = router.capacity(parsed.options, s, e)
  token_mask = jnp.ones((groups, s), bool)
  # The logits' shape comes from the router's own logits layer.
  layer = router.logits_module(parsed.options, e, capacity, "router")
  tokens = jax.ShapeDtypeStruct((groups, s, args.hidden), jnp.float32)
  shape = jax.eval_shape(lambda x: layer.init_with_output(jax.random.key(0), x)[0],
                         tokens).shape

  state = router.state.init(parsed.options, e) if router.state else None

  def loss(logits, rng):
    r = vrouters.route(logits, token_mask, parsed, capacity, train=True, rng=rng, state=state)
    r = r[0] if state is not None else r    # (routing, statistics) for a stateful router
    return jnp.sum(r.combine_weight) + r.auxiliary_loss

  logits = jax.random.normal(jax.random.key(3), shape)
  return jax.jit(jax.value_and_grad(loss)), (logits, jax.random.key(4))


def time_round_robin(calls, rounds: int, steps: int, clock):
  """{name: [mean seconds per call in each round]} for {name: call(i) -> output}.

  Calls must be warm; each round times `steps` calls of every name in turn (i is
  the step within the round) and waits for the last output.
  """
  times = {name: [] for name in calls}
  for _ in range(rounds):
    for name, call in calls.items():
      t0 = clock()
      for i in range(steps):
        out = call(i)
      jax.block_until_ready(out)
      times[name].append((clock() - t0) / steps)
  return times


def report_failure(name: str, err: Exception) -> None:
  """One line for a router that failed to build or compile (e.g. a kernel that does
  not lower on this backend); the run goes on without it."""
  first = (str(err).strip().splitlines() or [""])[0][:300]
  print(f"{name}: FAILED, left out ({type(err).__name__}: {first})", flush=True)


def warm_router_steps(names, groups, args):
  """{name: (fn, args)} of `make_router_step`, each compiled and run once; a router
  that fails is reported and left out."""
  fns = {}
  for name in names:
    try:
      fn, fargs = make_router_step(name, groups, args)
      jax.block_until_ready(fn(*fargs))
    except Exception as err:  # pylint: disable=broad-except
      report_failure(name, err)
      continue
    fns[name] = (fn, fargs)
  return fns


def router_only(args, clock):
  tokens = (args.image // args.patch) ** 2 + 1
  groups = args.batch * tokens // args.group_size
  fns = warm_router_steps(args.routers.split(","), groups, args)
  calls = {name: (lambda i, fn=fn, fargs=fargs: fn(*fargs)) for name, (fn, fargs) in fns.items()}
  times = time_round_robin(calls, args.rounds, args.steps, clock)
  print(f"\nrouter only (forward + backward): G={groups}, S={args.group_size}, "
        f"E={args.experts}, capacity_factor={args.capacity_factor}, sparse_ot k={args.k}, "
        f"{jax.devices()[0].platform}, threads={args.threads or 'default'}, clock={args.clock}")
  print(f"{'router':<22}{'best ms':>10}{'median ms':>12}{'best vs topk':>14}")
  for name, v in times.items():
    ratio = f"{min(v) / min(times['topk']):>13.2f}x" if "topk" in times else ""
    print(f"{name:<22}{1e3 * min(v):>10.2f}{1e3 * statistics.median(v):>12.2f}{ratio}")
  return times


# S:E:k points of the grid (k: sparse_ot's k, the buffer size C); token_choice
# points solve the transposed problem (rows = E experts, columns = S tokens,
# at most K = 2 per token; k is then the capacity).
DEFAULT_GRID = ("64:8:8,64:8:16,128:8:16,128:32:8,128:32:28,256:8:16,256:8:64,256:32:8,"
                "256:32:28,400:8:28,400:8:64,400:32:8,400:32:16,400:32:28,400:32:64,"
                "64:8:16:token_choice,400:32:28:token_choice")


def grid(args, clock):
  """Each path of sparse_ot (and topk) alone at each routing shape of --grid."""
  from vmoe_sparse_ot.nn.routers import sparse_ot
  spec = DEFAULT_GRID if args.grid == "default" else args.grid
  paths = [p for p in args.routers.split(",") if p != "topk"]
  rows = []
  print(f"router alone (forward + backward) per routing shape, ms (best of {args.rounds} "
        f"rounds of {args.steps}; median in brackets); G = ceil({args.tokens} / S); "
        f"{jax.devices()[0].platform}, jax {jax.__version__}, "
        f"threads={args.threads or 'default'}, clock={args.clock}")
  print(f"{'S:E:k form':<26}{'G':>4}{'topk':>16}" + "".join(f"{p:>24}" for p in paths)
        + f"{'auto picks':>12}")
  for point in spec.split(","):
    s, e, k, *form = point.split(":")
    pargs = argparse.Namespace(**{**vars(args), "group_size": int(s), "experts": int(e),
                                  "k": int(k), "form": form[0] if form else "expert_choice"})
    groups = -(-args.tokens // pargs.group_size)
    fns = {name: make_router_step(name, groups, pargs) for name in ["topk"] + paths}
    for fn, fargs in fns.values():
      jax.block_until_ready(fn(*fargs))
    calls = {n: (lambda i, fn=fn, fargs=fargs: fn(*fargs)) for n, (fn, fargs) in fns.items()}
    times = time_round_robin(calls, args.rounds, args.steps, clock)
    opts = sparse_ot.SparseOTOptions(form=pargs.form, k=pargs.k,
                                     capacity_factor=args.capacity_factor)
    picked = sparse_ot.picked_implementation(opts, pargs.group_size, pargs.experts)
    best = {n: min(v) for n, v in times.items()}
    cells = "".join(f"{1e3 * best[p]:>8.2f} ({1e3 * statistics.median(times[p]):.2f}) "
                    f"{best[p] / best['topk']:>5.2f}x" for p in paths)
    print(f"{point:<26}{groups:>4}{1e3 * best['topk']:>8.2f} "
          f"({1e3 * statistics.median(times['topk']):.2f}){cells}{picked:>12}", flush=True)
    rows.append({"point": point, "groups": groups, "rounds_s": times, "auto": picked})
  return rows


def agreement(args, seeds=(0, 1)):
  """Pairs dispatched by both / by either, each sparse_ot implementation in
  --routers against implementation='reference' (Adam from zero through
  jax.vmap(ot.solve)), on N(0, 1) logits of the router-only shapes."""
  from vmoe_sparse_ot.nn.routers import sparse_ot
  tokens = (args.image // args.patch) ** 2 + 1
  groups = args.batch * tokens // args.group_size
  names = [n for n in args.routers.split(",") if n.startswith("sparse_ot")]
  mask = jnp.ones((groups, args.group_size), bool)

  def dispatched(implementation, logits):
    cfg = default_router_config()
    set_router_options(cfg, args, f"sparse_ot:{implementation}")
    opts = vrouters.parse_router_options(cfg).options
    capacity = sparse_ot.capacity(opts, args.group_size, args.experts)
    return jax.jit(lambda x: sparse_ot.plans(x, mask, opts, capacity) > 0)(logits)

  print(f"\ndispatched pairs agreeing with implementation='reference' (both / either):")
  for seed in seeds:
    logits = jax.random.normal(jax.random.key(seed), (groups, args.group_size, args.experts))
    ref = dispatched("reference", logits)
    for name in names:
      got = dispatched(name.partition(":")[2], logits)   # none: the default
      both, either = jnp.sum(got & ref), jnp.sum(got | ref)
      print(f"  seed {seed} {name:<22}{float(both / either):.4f}")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--routers", default=",".join(vrouters.ROUTERS))
  p.add_argument("--batch", type=int, default=128)
  p.add_argument("--image", type=int, default=32)
  p.add_argument("--patch", type=int, default=4)
  p.add_argument("--hidden", type=int, default=64)
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--mlp", type=int, default=128)
  p.add_argument("--experts", type=int, default=8)
  p.add_argument("--group_size", type=int, default=64)
  p.add_argument("--dispatcher", default="indices")
  p.add_argument("--pallas_kernel", default=None, type=pallas_kernel,
                 help="sparse_ot:pallas's kernel as VARIANT:WARPS, e.g. nm-reload:8 "
                 "(default: the kernel's own defaults)")
  p.add_argument("--capacity_factor", type=float, default=1.0)
  p.add_argument("--k", type=int, default=None,
                 help="sparse_ot nonzeros per expert (and its buffer size); None: C")
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--rounds", type=int, default=5)
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--threads", default=None, help="XLA CPU intra-op threads (1: single)")
  p.add_argument("--clock", default="wall", choices=("wall", "cpu"),
                 help="wall time, or this process's CPU time (steadier on a shared "
                      "machine; use with --threads 1)")
  p.add_argument("--json", default=None, help="also write the results here")
  p.add_argument("--router-only", action="store_true",
                 help="time each router alone (forward + backward), not the model")
  p.add_argument("--agreement", action="store_true",
                 help="with --router-only: also each sparse_ot implementation's dispatched "
                      "pairs against implementation='reference'")
  p.add_argument("--grid", default=None,
                 help="time the routers alone at each S:E:k[:form] shape of this comma-"
                      "separated list ('default': DEFAULT_GRID); --routers: the paths "
                      "(default sparse_ot:fast,sparse_ot:candidates), topk always")
  p.add_argument("--tokens", type=int, default=6400,
                 help="with --grid: tokens per MoE layer (6400: B/32 at batch 128)")
  args = p.parse_args(argv)
  if args.pallas_kernel:
    use_pallas_kernel(args.pallas_kernel)
  clock = time.perf_counter if args.clock == "wall" else time.process_time
  if args.grid:
    if args.routers == p.get_default("routers"):
      args.routers = "sparse_ot:fast,sparse_ot:candidates"
    rows = grid(args, clock)
    if args.json:
      with open(args.json, "w") as f:
        json.dump({"args": vars(args), "jax": jax.__version__, "rows": rows}, f, indent=2)
    return
  if args.router_only:
    times = router_only(args, clock)
    if args.agreement:
      agreement(args)
    if args.json:
      with open(args.json, "w") as f:
        json.dump({"args": vars(args), "rounds_s": times}, f, indent=2)
    return

  images = jax.random.normal(jax.random.key(0), (args.batch, args.image, args.image, 3))
  labels = jax.random.randint(jax.random.key(1), (args.batch,), 0, 10)
  tx = optax.adam(1e-3)
  # 'dense': the same sizes. 'dense_active': the same active parameters -- every
  # MLP widened so that the total MLP width equals the MoE model's active one
  # (each token goes through K = 2 experts in the L/2 MoE blocks).
  layers = len(vnn.vit.parse_moe_layers("every_2", args.layers))
  k = default_model_config().encoder.moe.router.num_selected_experts
  active_mlp = args.mlp * (args.layers + layers * (k - 1)) // args.layers
  models = {"dense": make_config(args, "vit"),
            "dense_active": make_config(args, "vit", mlp_dim=active_mlp)}
  for r in args.routers.split(","):
    models[r] = make_config(args, "vit_moe", r)

  state = {}
  for name, cfg in models.items():
    model = vnn.build_model(cfg)
    t0 = time.perf_counter()
    try:
      params, model_state = vnn.router_state.split(jax.jit(
          lambda k, m=model: m.init({"params": k}, images, train=False))(jax.random.key(2)))
      step = make_step(model, tx, model_state)
      opt_state = tx.init(params)
      for i in range(args.warmup):
        params, opt_state, loss = step(params, opt_state, images, labels, jax.random.key(i))
      jax.block_until_ready(loss)
    except Exception as err:  # pylint: disable=broad-except
      report_failure(name, err)
      continue
    print(f"{name}: compiled + {args.warmup} warm-up steps in {time.perf_counter() - t0:.1f} s")
    state[name] = [step, params, opt_state]

  def train_call(st):
    def call(i):  # one train step; the model's state moves on between calls
      step, params, opt_state = st
      st[1], st[2], loss = step(params, opt_state, images, labels, jax.random.key(i))
      return st[1], loss
    return call

  # Each router alone at the model's shapes, timed in the same rounds (its share of
  # the step is an estimate, see the module doc).
  tokens = (args.image // args.patch) ** 2 + 1
  groups = -(-args.batch * tokens // args.group_size)
  models = {n: cfg for n, cfg in models.items() if n in state}
  routed = [r for r in args.routers.split(",") if r in state]
  router_calls = {f"router:{r}": lambda i, fn=fn, fargs=fargs: fn(*fargs)
                  for r, (fn, fargs) in warm_router_steps(routed, groups, args).items()}
  rounds = time_round_robin({**{name: train_call(st) for name, st in state.items()},
                             **router_calls}, args.rounds, args.steps, clock)

  best = {n: min(v) for n, v in rounds.items()}
  median = {n: statistics.median(v) for n, v in rounds.items()}
  shares = {r: layers * best[f"router:{r}"] / best[r] for r in routed
            if f"router:{r}" in best}
  ratios = {}
  if "topk" in best:
    ratios["topk/dense"] = best["topk"] / best["dense"]
    ratios["topk/dense_active"] = best["topk"] / best["dense_active"]
    for n in models:
      if n not in ("dense", "dense_active", "topk"):
        ratios[f"{n}/topk"] = best[n] / best["topk"]
  print(f"\nbatch {args.batch}, {tokens} tokens/image, D={args.hidden}, L={args.layers}, "
        f"H={args.mlp} (dense_active: {active_mlp}), E={args.experts}, S={args.group_size}, "
        f"K={k}, "
        f"dispatcher={args.dispatcher}, pallas kernel={args.pallas_kernel or 'its defaults'}, "
        f"{jax.devices()[0].platform}, "
        f"threads={args.threads or 'default'}, clock={args.clock}")
  print(f"{'model':<18}{'best ms/step':>14}{'median ms/step':>16}{'best vs dense':>15}"
        f"{'router ms x L':>15}{'router share':>14}")
  for n in models:
    router = (f"{1e3 * layers * best[f'router:{n}']:>15.1f}{100 * shares[n]:>13.1f}%"
              if n in shares else "")
    print(f"{n:<18}{1e3 * best[n]:>14.1f}{1e3 * median[n]:>16.1f}"
          f"{best[n] / best['dense']:>14.2f}x{router}")
  print(f"router ms x L: one router's forward + backward alone (G={groups}) times the "
        f"{layers} MoE layers; share: that over the step")
  for k, v in ratios.items():
    print(f"{k}: {v:.3f}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"args": vars(args), "best_s": best, "median_s": median,
                 "rounds_s": rounds, "ratios": ratios, "router_share": shares}, f, indent=2)


if __name__ == "__main__":
  main()
