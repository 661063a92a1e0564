"""Three accelerator probes, each line printed as soon as it is measured (a run cut
off by its time limit keeps what it printed).

--part pallas: the router's solve alone at the paper's B/32 routing shapes
  (expert choice, G groups of S tokens x E experts, k nonzeros per expert
  column, 50 Adam steps, the router's costs 1 - softmax of random logits):
  'fast' (ot.batched_semi_dual_adam) against the fused kernel
  (ot.batched_semi_dual_adam_pallas) in each variant of --variants (block
  layout "mn": the group's (tokens, experts) block, "nm": its transpose;
  "-reload": reload_costs=True; "-inc": selection="incremental", each step's
  members reached from the previous step's) at several Triton warp counts
  (1-16), at each G
  of --groups, forward only
  (the router stops the gradient before the solve), jitted and warm, best of
  --repeats; with each kernel's largest plan difference from 'fast'. Says which
  warp count to use and whether the kernel beats 'fast' on this device.

--part ot: where the time of `ot.solve` goes at (m, n, k, gamma) = (10000, 100,
  100, 0.1) in float64 (benchmarks/ot_solvers.py's row that printed nothing on a
  GPU in 230 s): the column top-k that an evaluation runs (the radix selection
  against `lax.top_k`), one semi-dual evaluation (value + gradient), a jitted solve
  with max_iter 100, then the defaults (1000 iterations), each first call
  (compile + run) and warm.

--part moe: where an MoE layer's time goes beyond a dense MLP's (issue 40, item
  5), at the S/32-sized model's shapes (batch 512 x 50 tokens, D 512, MLP 2048,
  E 32, K = 2 TopK, capacity factor 1.05, S = 400): forward + backward of one
  layer, jitted and warm, best of --repeats: the dense MLP; the dense MLP at the
  MoE's active width (K x MLP); the whole TopK MoE layer with each dispatcher
  ('indices', the default; 'einsum', and 'einsum' in bfloat16 as the reference
  runs it); and the layer's pieces alone -- router (logits layer + TopK),
  dispatch + combine of each dispatcher, the experts on their (E, G*C, D) buffers.

    python benchmarks/gpu_probe.py --part pallas [--groups 512,64]
    python benchmarks/gpu_probe.py --part ot
    python benchmarks/gpu_probe.py --part moe [--batch 512]
"""
from __future__ import annotations

import argparse
import itertools
import json
import signal
import sys
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
  """The solve at each G of --groups: one kernel program per group, so G against the
  device's SMs says whether a program's latency or the work decides the time."""
  from vmoe_sparse_ot import ot  # pylint: disable=g-import-not-at-top
  s, e, k = args.group_size, args.experts, args.k
  for g in args.groups:
    logits = jax.random.normal(jax.random.key(0), (g, s, e), jnp.float32)
    cost = 1.0 - jax.nn.softmax(logits, axis=-1)
    a = jnp.ones((g, s), jnp.float32)
    b = jnp.full((g, e), s / e, jnp.float32)
    print(f"router solve alone: G={g}, S={s}, E={e}, k={k}, 50 Adam steps, float32, "
          f"{jax.devices()[0].device_kind}, JAX {jax.__version__}", flush=True)
    fast = jax.jit(lambda c, a, b: ot.batched_semi_dual_adam(c, a, b, k, 1.0, 50, 1e-2))
    first, best, ref = _timed(fast, (cost, a, b), args.repeats)
    fast_ms = 1e3 * best
    print(f"{'fast':<24} first {first:7.2f} s   warm {fast_ms:8.3f} ms", flush=True)
    record[f"G{g}/fast_ms"] = fast_ms
    for variant in args.variants:
      for warps in args.warps:
        label, key = f"pallas {variant} w={warps}", f"G{g}/pallas_{variant}_w{warps}"
        fn = jax.jit(lambda c, a, b, kw=kernel_args(variant, warps):
                     ot.batched_semi_dual_adam_pallas(
                         c, a, b, k, 1.0, 50, 1e-2, interpret=False if args.compiled else None,
                         **kw))
        try:
          first, best, plan = _timed(fn, (cost, a, b), args.repeats)
        except Exception as err:  # pylint: disable=broad-except
          first_line = (str(err).strip().splitlines() or [""])[0][:300]
          print(f"{label:<24} FAILED: {type(err).__name__}: {first_line}", flush=True)
          record[key] = f"failed: {type(err).__name__}"
          continue
        diff = float(jnp.max(jnp.abs(plan - ref)))
        print(f"{label:<24} first {first:7.2f} s   warm {1e3 * best:8.3f} ms   "
              f"vs fast {best * 1e3 / fast_ms:5.2f}x   max |plan - fast's| {diff:.2e}",
              flush=True)
        record[key + "_ms"] = 1e3 * best
        record[key + "_maxdiff"] = diff
        # The fastest kernel whose plans match 'fast''s (float32, mass ~1 per token),
        # as routers.py --pallas_kernel takes it: gpu.sh times the model's step with it.
        if diff < 1e-4 and best * 1e3 < record.get(f"G{g}/fastest_ms", float("inf")):
          record[f"G{g}/fastest_ms"] = best * 1e3
          record[f"G{g}/fastest"] = f"{variant}:{warps}"


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


def moe_part(args, record):
  from vmoe_sparse_ot.nn import dispatch, moe, vit  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.nn import routers as vrouters  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.nn.model_config import default_router_config  # pylint: disable=g-import-not-at-top
  b, n, d, h, e, s = (args.batch, args.tokens, args.hidden, args.mlp, args.experts,
                      args.group_size)
  cfg = default_router_config()
  cfg.name, cfg.capacity_factor = "topk", args.capacity_factor
  router_cfg = vrouters.parse_router_options(cfg)
  router = vrouters.get_router("topk")
  k = cfg.num_selected_experts
  g = -(-b * n // s)
  capacity = router.capacity(router_cfg.options, s, e)
  keys = (jax.random.fold_in(jax.random.key(0), i) for i in itertools.count())
  x = jax.random.normal(next(keys), (b, n, d), jnp.float32)
  rngs = {"gating": next(keys), "dropout": next(keys)}
  print(f"one MoE layer's pieces, forward + backward: {b} x {n} tokens, D={d}, MLP={h}, "
        f"E={e}, K={k} (topk), capacity factor {args.capacity_factor}: S={s}, G={g}, "
        f"C={capacity}; float32, {jax.devices()[0].device_kind}, JAX {jax.__version__}",
        flush=True)

  def grads_of(loss, inputs, consts):
    """The jitted gradient of `loss(*inputs, *consts)` w.r.t. `inputs`, and its arguments.
    Arrays are arguments, never closed over: XLA would fold them as constants."""
    return jax.jit(jax.grad(loss, argnums=tuple(range(len(inputs))))), (*inputs, *consts)

  def layer(module, inp):
    params = module.init({"params": next(keys), **rngs}, inp, train=True)["params"]
    out = jax.eval_shape(lambda p, v: module.apply({"params": p}, v, train=True, rngs=rngs),
                         params, inp)
    y_shape = out[0] if isinstance(out, tuple) else out
    ct = jax.random.normal(next(keys), y_shape.shape, y_shape.dtype)

    def loss(p, v, ct, rngs):
      y = module.apply({"params": p}, v, train=True, rngs=rngs)
      if isinstance(y, tuple):          # the MoE layer: (y, auxiliary loss, metrics)
        return jnp.vdot(y[0], ct) + y[1]
      return jnp.vdot(y, ct)
    return grads_of(loss, (params, inp), (ct, rngs))

  def moe_layer(dispatcher, dtype=None):
    return layer(moe.MoeLayer(e, h, s, router_cfg, dispatcher=dispatcher,
                              routed_tokens_dtype=dtype), x)

  # The layer's groups: the last one padded with masked tokens (as MoeLayer does).
  tokens = jnp.pad(x.reshape(-1, d), ((0, g * s - b * n), (0, 0))).reshape(g, s, d)
  logits_layer = router.logits_module(router_cfg.options, e, capacity, "router")
  logits_params = logits_layer.init(next(keys), tokens)["params"]
  mask = (jnp.arange(g * s) < b * n).reshape(g, s)
  ct_w = jax.random.normal(next(keys), (g, e, capacity), jnp.float32)

  def route(p, v, mask, rng):
    return vrouters.route(logits_layer.apply({"params": p}, v).astype(jnp.float32), mask,
                          router_cfg, capacity, True, rng)

  def router_loss(p, v, mask, ct_w, rng):
    r = route(p, v, mask, rng)
    return jnp.vdot(r.combine_weight, ct_w) + r.auxiliary_loss

  routing = jax.jit(route)(logits_params, tokens, mask, rngs["gating"])
  ct_y = jax.random.normal(next(keys), tokens.shape, jnp.float32)

  def dispatch_combine(name, dtype=None):
    dispatch_fn, combine_fn = dispatch.get_dispatcher(name, dtype)

    def loss(v, w, routing, ct_y):
      r = routing._replace(combine_weight=w)
      return jnp.vdot(combine_fn(dispatch_fn(v, r), r, s), ct_y)
    return grads_of(loss, (tokens, routing.combine_weight), (routing, ct_y))

  buffers = jax.random.normal(next(keys), (e, g * capacity, d), jnp.float32)
  rows = [
      ("dense MLP", "", lambda: layer(vit.MlpBlock(h), x)),
      (f"dense MLP, {k} x wider", "(the MoE's active width)", lambda: layer(vit.MlpBlock(k * h), x)),
      ("MoE layer, indices", "(the default)", lambda: moe_layer("indices")),
      ("MoE layer, einsum", "", lambda: moe_layer("einsum")),
      ("MoE layer, einsum bf16", "(the reference's)", lambda: moe_layer("einsum", "bfloat16")),
      ("  router", "(logits layer + TopK)",
       lambda: grads_of(router_loss, (logits_params, tokens), (mask, ct_w, rngs["gating"]))),
      ("  dispatch+combine, indices", "", lambda: dispatch_combine("indices")),
      ("  dispatch+combine, einsum", "", lambda: dispatch_combine("einsum")),
      ("  dispatch+combine, einsum bf16", "", lambda: dispatch_combine("einsum", "bfloat16")),
      ("  experts", f"(E={e} MLPs on {g * capacity} slots each)",
       lambda: layer(moe.Experts(e, h), buffers)),
  ]
  dense_ms = None
  for name, note, build in rows:
    try:
      fn, inputs = build()
      first, best, _ = _timed(fn, inputs, args.repeats)
    except Exception as err:  # pylint: disable=broad-except
      first_line = (str(err).strip().splitlines() or [""])[0][:300]
      print(f"{name:<32} FAILED: {type(err).__name__}: {first_line}", flush=True)
      record[name.strip()] = f"failed: {type(err).__name__}"
      continue
    ms = 1e3 * best
    dense_ms = dense_ms or ms
    print(f"{name:<32} first {first:6.2f} s   warm {ms:8.3f} ms   {ms / dense_ms:5.2f}x dense MLP"
          f"   {note}", flush=True)
    record[name.strip()] = ms


# A block layout, then "-reload" for reload_costs=True, then "-inc" for
# selection="incremental".
VARIANTS = tuple(layout + reload + inc for inc in ("", "-inc") for reload in ("", "-reload")
                 for layout in ("mn", "nm"))


def kernel_args(variant: str, warps: int) -> dict:
  """`ot.batched_semi_dual_adam_pallas`'s keyword arguments for a variant of VARIANTS
  at `warps` Triton warps; ValueError for another name."""
  if variant not in VARIANTS:
    raise ValueError(f"unknown kernel variant {variant!r}: {', '.join(VARIANTS)}")
  layout, *options = variant.split("-")
  return {"num_warps": warps, "block_layout": layout, "reload_costs": "reload" in options,
          "selection": "incremental" if "inc" in options else "passes"}


def variant_list(text: str) -> list[str]:
  variants = text.split(",")
  for v in variants:
    try:
      kernel_args(v, 4)
    except ValueError as e:
      raise argparse.ArgumentTypeError(str(e)) from None
  return variants


def int_list(text: str) -> list[int]:
  return [int(w) for w in text.split(",")]


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--part", required=True, choices=("pallas", "ot", "moe"))
  p.add_argument("--groups", type=int_list, default=[512, 64],
                 help="--part pallas: comma-separated group counts G (512: the router "
                 "alone at batch 4096; 64: one MoE layer of the S/32-sized model's step)")
  p.add_argument("--group_size", type=int, default=400)
  p.add_argument("--experts", type=int, default=32)
  p.add_argument("--k", type=int, default=16)
  p.add_argument("--batch", type=int, default=512, help="--part moe: images")
  p.add_argument("--tokens", type=int, default=50, help="--part moe: tokens per image")
  p.add_argument("--hidden", type=int, default=512, help="--part moe: D")
  p.add_argument("--mlp", type=int, default=2048, help="--part moe: MLP width")
  p.add_argument("--capacity_factor", type=float, default=1.05, help="--part moe")
  p.add_argument("--warps", type=int_list, default=[4, 8, 16],
                 help="comma-separated Triton warp counts, e.g. 4,8,16")
  p.add_argument("--variants", type=variant_list,
                 default=["mn-inc", "nm-inc", "mn", "nm", "nm-reload"],
                 help="--part pallas: the kernel's variants, comma-separated, timed in this "
                 "order: a block layout (mn, nm), then '-reload' for reload_costs=True, "
                 "then '-inc' for selection='incremental'")
  p.add_argument("--compiled", action="store_true",
                 help="never Pallas interpret mode (default: interpret on the CPU only)")
  p.add_argument("--repeats", type=int, default=5)
  p.add_argument("--json", default=None, help="also write the figures here")
  args = p.parse_args(argv)
  record = {"part": args.part, "device": jax.devices()[0].device_kind, "jax": jax.__version__}
  # gpu.sh's `timeout` stops a part with SIGTERM: exit through the `finally` below,
  # so that the figures measured so far (the fastest kernel among them) are written.
  signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(124))
  try:
    {"pallas": pallas_part, "ot": ot_part, "moe": moe_part}[args.part](args, record)
  finally:
    if args.json:
      with open(args.json, "w") as f:
        json.dump(record, f, indent=1)


if __name__ == "__main__":
  main()
