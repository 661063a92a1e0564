"""The model contract: shapes, aux dict, determinism, gradients, config errors."""
import re

import flax
import numpy as np
import pytest
import jax
import jax.numpy as jnp
import optax

from vmoe_sparse_ot import nn as vnn
from vmoe_sparse_ot.nn.vit import parse_moe_layers
from tests.nn.helpers import tiny_config

METRICS = {"auxiliary_loss", "dropped_fraction", "tokens_per_expert_min",
           "tokens_per_expert_mean", "tokens_per_expert_max", "experts_per_token",
           "max_load_violation", "tokens_with_0_experts", "tokens_with_1_expert",
           "tokens_with_2plus_experts", "z_loss", "router_entropy", "router_top_prob",
           "empty_experts"}
ROUTERS = ["topk", "expert_choice", "sbase", "sparse_ot", "soft_moe"]


def _need_ot(router):
  if router in ("sbase", "sparse_ot"):
    ot = pytest.importorskip("vmoe_sparse_ot.ot")
    if not hasattr(ot, "solve" if router == "sparse_ot" else "sinkhorn"):
      pytest.skip("vmoe_sparse_ot.ot not available yet")


def _images(b=4, seed=0):
  return jax.random.normal(jax.random.key(seed), (b, 8, 8, 3))


def _init(model, images):
  return jax.jit(lambda k: model.init({"params": k}, images, train=False))(
      jax.random.key(0))["params"]


@pytest.fixture(scope="module")
def params():
  """params(router): the tree depends on the router's logits layer only (soft_moe's differs)."""
  cache = {}

  def get(router):
    key = router == "soft_moe"
    if key not in cache:
      p = _init(vnn.build_model(tiny_config(router)), _images())
      # A non-zero head so that gradients flow back through the encoder.
      p["head"]["kernel"] = jax.random.normal(jax.random.key(3), p["head"]["kernel"].shape)
      cache[key] = p
    return cache[key]
  return get


@pytest.mark.parametrize("router", ROUTERS)
def test_forward_contract_eval_determinism_rngs_and_gradients(router, params):
  _need_ot(router)
  cfg = tiny_config(router)
  cfg.encoder.dropout_rate = 0.1
  model = vnn.build_model(cfg)
  images = _images(5)                # 5 images x 4 tokens = 20 tokens: last group padded
  labels = np.array([0, 1, 2, 0, 1])

  @jax.jit
  def run(p, k1, k2):
    """Eval forward, and a training loss's gradient with the given rngs."""
    eval_out = model.apply({"params": p}, images, train=False)

    def loss_fn(p):
      out, a = model.apply({"params": p}, images, train=True,
                           rngs={"dropout": k1, "gating": k2})
      loss = optax.softmax_cross_entropy_with_integer_labels(out, labels).mean()
      return loss + a["auxiliary_loss"], out

    grads, train_logits = jax.grad(loss_fn, has_aux=True)(p)
    return eval_out, train_logits, grads

  params = params(router)
  (logits, aux), train_a, grads = run(params, jax.random.key(1), jax.random.key(2))
  assert logits.shape == (5, 3)
  assert aux["pre_logits"].shape == (5, 16)
  assert set(aux["routing"]) == {"encoderblock_1"}
  metrics = jax.tree.map(np.asarray, aux["routing"]["encoderblock_1"])   # numpy: no compiles
  assert all(jnp.shape(v) == () for v in metrics.values())
  assert METRICS <= set(metrics)
  assert 0 <= metrics["router_entropy"] <= np.log(4) + 1e-6     # E = 4
  assert 0.25 - 1e-6 <= metrics["router_top_prob"] <= 1 and metrics["z_loss"] >= 0
  if router == "soft_moe":       # every token reaches every expert: nothing is dropped
    assert {"dispatch_weights_max_mean", "combine_weights_max_mean"} <= set(metrics)
    assert metrics["dropped_fraction"] == 0 and metrics["max_load_violation"] == 0
    assert metrics["tokens_with_2plus_experts"] == 1 and metrics["empty_experts"] == 0
  else:
    assert metrics["tokens_per_expert_max"] <= 4     # C = ceil(8*2*1.0/4) = 4
    assert 0.0 <= metrics["dropped_fraction"] <= 1.0

  # Eval is deterministic (and needs no rngs); training depends on its rngs only.
  (logits2, aux2), train_b, _ = run(params, jax.random.key(1), jax.random.key(2))
  _, train_c, _ = run(params, jax.random.key(5), jax.random.key(6))
  np.testing.assert_array_equal(logits, logits2)
  np.testing.assert_array_equal(aux["pre_logits"], aux2["pre_logits"])
  np.testing.assert_array_equal(train_a, train_b)
  assert not np.allclose(train_a, train_c)

  # Gradients reach the router and every expert (checked in numpy: no compiles).
  moe = jax.tree.map(np.asarray, grads["encoder"]["encoderblock_1"]["moe"])
  assert all(np.abs(v).sum() > 0 for v in jax.tree.leaves(moe["router"]))
  per_expert = np.abs(moe["experts"]["wi_kernel"]).sum(axis=(1, 2))
  assert (per_expert > 0).all(), per_expert


def test_dense_vit_and_gap_representation():
  cfg = tiny_config()
  cfg.name = "vit"
  cfg.classifier = "token"
  cfg.representation_size = 7
  model = vnn.build_model(cfg)
  images = _images()
  params = _init(model, images)
  # Jitted: an eager apply compiles each op as its own program (about 60).
  logits, aux = jax.jit(lambda p: model.apply({"params": p}, images, train=False))(params)
  assert logits.shape == (4, 3) and aux["pre_logits"].shape == (4, 7)
  assert aux["routing"] == {} and float(aux["auxiliary_loss"]) == 0.0
  flat = flax.traverse_util.flatten_dict(params, sep="/")
  assert not any(re.search(vnn.EXPERT_PARAMS_REGEX, k) for k in flat)
  assert params["cls"].shape == (1, 1, 16)


def test_expert_params_regex_matches_exactly_the_expert_weights():
  cfg = tiny_config()
  cfg.encoder.num_layers = 4
  model = vnn.build_model(cfg)
  shapes = jax.eval_shape(lambda k: model.init({"params": k}, _images(), train=False),
                          jax.random.key(0))["params"]
  flat = flax.traverse_util.flatten_dict(shapes, sep="/")
  matched = {k for k in flat if re.fullmatch(vnn.EXPERT_PARAMS_REGEX, k)}
  assert matched == {f"encoder/encoderblock_{i}/moe/experts/{w}" for i in (1, 3)
                     for w in ("wi_kernel", "wi_bias", "wo_kernel", "wo_bias")}
  assert all(flat[k].shape[0] == 4 for k in matched)
  assert re.search(vnn.EXPERT_PARAMS_REGEX, "params/" + next(iter(matched)))


def _reference_layers(where: str, n: int, num_layers: int) -> tuple:
  """The reference V-MoE configs' placement: 'Every n' or 'Last n' (of the odd blocks)."""
  if where == "every":
    return tuple(range(n - 1, num_layers, n))
  return tuple(range(1, num_layers, 2))[-n:]


def test_parse_moe_layers():
  assert parse_moe_layers("every_2", 6) == (1, 3, 5)
  # last_N: the last N of the every-2 positions, not the last N blocks.
  assert parse_moe_layers("last_2", 12) == (9, 11)
  assert parse_moe_layers("last_2", 8) == (5, 7)          # V-MoE-S: 8 blocks
  assert parse_moe_layers("last_5", 24) == (15, 17, 19, 21, 23)
  assert parse_moe_layers("last_2", 6) == (3, 5)
  assert parse_moe_layers("every_3", 12) == (2, 5, 8, 11)
  assert parse_moe_layers("every_1", 3) == (0, 1, 2)
  for where, n, num_layers in [("last", 1, 12), ("last", 2, 12), ("last", 5, 24),
                               ("last", 4, 8), ("every", 2, 12), ("every", 2, 8),
                               ("every", 4, 32)]:
    assert parse_moe_layers(f"{where}_{n}", num_layers) == \
        _reference_layers(where, n, num_layers)
  assert parse_moe_layers("0, 2", 6) == (0, 2)
  assert parse_moe_layers([3, 1], 6) == (1, 3)
  with pytest.raises(ValueError, match="every_N"):
    parse_moe_layers("odd", 6)
  with pytest.raises(ValueError, match="every_N"):
    parse_moe_layers("last_0", 6)
  with pytest.raises(ValueError, match=r"last_4'.*3 every-2 blocks \(1, 3, 5\)"):
    parse_moe_layers("last_4", 6)
  with pytest.raises(ValueError, match=r"\[7\]"):
    parse_moe_layers("1,7", 6)


def test_config_errors_list_valid_values():
  with pytest.raises(ValueError, match="expert_choice.*sbase.*sparse_ot.*topk"):
    vnn.build_model(tiny_config("top2"))
  cfg = tiny_config()
  with cfg.unlocked():
    cfg.encoder.moe.router.sbase.tau = 1.0
  with pytest.raises(ValueError, match=r"\['tau'\].*epsilon"):
    vnn.build_model(cfg)
  cfg = tiny_config()
  with cfg.unlocked():
    cfg.encoder.moe.router.temperature = 1.0
  with pytest.raises(ValueError, match="temperature.*valid keys"):
    vnn.build_model(cfg)
  with pytest.raises(ValueError, match="token_choice"):
    vnn.build_model(tiny_config("sparse_ot", **{"sparse_ot.form": "rows"}))
  cfg = tiny_config()
  cfg.encoder.moe.dispatcher = "loop"
  with pytest.raises(ValueError, match="einsum.*indices"):
    vnn.build_model(cfg)
  cfg = tiny_config()
  cfg.encoder.moe.routed_tokens_dtype = "float16"
  with pytest.raises(ValueError, match=r"moe.routed_tokens_dtype must be None or one of "
                     r"\['float32', 'bfloat16'\]"):
    vnn.build_model(cfg)
  cfg = tiny_config()
  cfg.name = "resnet"
  with pytest.raises(ValueError, match="vit_moe"):
    vnn.build_model(cfg)


def test_variant_sets_vit_sizes_and_patch():
  cfg = tiny_config()
  cfg.variant = "S/16"
  model = vnn.build_model(cfg)
  assert (model.hidden_size, model.num_layers, model.num_heads, model.mlp_dim,
          model.patch_size) == (384, 12, 6, 1536, (16, 16))
  assert model.moe_layers == (1, 3, 5, 7, 9, 11)          # every_2
  assert model.representation_size is None
  cfg.variant = "Q/16"
  with pytest.raises(ValueError, match="'Ti', 'S', 'B', 'L', 'H'.*V-MoE-SIZE/PATCH"):
    vnn.build_model(cfg)


def _reference_param_count(d, num_layers, mlp, patch, image, classes, experts, moe_layers,
                           representation_size):
  """Parameters of the reference V-MoE, layer by layer (kernels and biases)."""
  tokens = (image // patch) ** 2 + 1
  dense = lambda n_in, n_out: n_in * n_out + n_out
  embedding = patch * patch * 3 * d + d
  cls_and_position = d + tokens * d
  norms = 2 * 2 * d                                  # two LayerNorms, scale and bias
  attention = 4 * dense(d, d)                        # query, key, value, out
  mlp_block = dense(d, mlp) + dense(mlp, d)
  router = d * experts                               # the gate has no bias
  blocks = num_layers * (norms + attention) + (num_layers - moe_layers) * mlp_block \
      + moe_layers * (experts * mlp_block + router)
  pre_logits = dense(d, representation_size) if representation_size else 0
  head = dense(representation_size or d, classes)
  return embedding + cls_and_position + blocks + 2 * d + pre_logits + head


def _param_count(cfg, image):
  model = vnn.build_model(cfg)
  shapes = jax.eval_shape(lambda k: model.init({"params": k}, jnp.zeros((1, image, image, 3)),
                                               train=False), jax.random.key(0))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


def _vmoe_config(variant, experts, layers, group_size):
  cfg = vnn.model_config.default_model_config()
  cfg.variant, cfg.num_classes = variant, 1000
  cfg.encoder.moe.num_experts, cfg.encoder.moe.layers = experts, layers
  cfg.encoder.moe.group_size = group_size
  return cfg


def test_vmoe_variants_have_the_reference_sizes_and_parameter_counts():
  # The reference's vmoe_s32_last2 (ILSVRC2012) config: V-MoE-S/32, E = 8, Last 2.
  cfg = _vmoe_config("V-MoE-S/32", 8, "last_2", 8 * 50)
  model = vnn.build_model(cfg)
  assert (model.hidden_size, model.num_layers, model.mlp_dim, model.num_heads,
          model.patch_size, model.representation_size) == (512, 8, 2048, 8, (32, 32), 512)
  assert model.moe_layers == (5, 7)
  assert model.moe["split_rngs"] is False                 # experts initialized alike
  want = _reference_param_count(512, 8, 2048, 32, 224, 1000, 8, 2, 512)
  assert want == 56_999_400
  assert _param_count(cfg, 224) == want
  # V-MoE-B/32, E = 32, Every 2 (the paper's B/32): as ViT-B, plus pre-logits of size D.
  cfg = _vmoe_config("V-MoE-B/32", 32, "every_2", 8 * 50)
  model = vnn.build_model(cfg)
  assert (model.hidden_size, model.num_layers, model.mlp_dim, model.num_heads,
          model.representation_size, model.moe_layers) == (768, 12, 3072, 12, 768,
                                                           (1, 3, 5, 7, 9, 11))
  want = _reference_param_count(768, 12, 3072, 32, 224, 1000, 32, 6, 768)
  assert want == 967_334_632
  assert _param_count(cfg, 224) == want
  # A representation size that is set wins; 0 drops the layer.
  cfg.representation_size = 0
  assert vnn.build_model(cfg).representation_size is None
  cfg.representation_size = 256
  assert vnn.build_model(cfg).representation_size == 256


def _expert_dropout_rates(cfg):
  """{module path: dropout_rate} of every Experts and dense MLP module the model calls."""
  from vmoe_sparse_ot.nn.moe import Experts
  from vmoe_sparse_ot.nn.vit import MlpBlock
  seen = {}

  def record(next_fun, args, kwargs, context):
    if isinstance(context.module, (Experts, MlpBlock)) and context.method_name == "__call__":
      seen["/".join(context.module.scope.path)] = context.module.dropout_rate
    return next_fun(*args, **kwargs)

  with flax.linen.intercept_methods(record):
    jax.eval_shape(lambda: vnn.build_model(cfg).init(
        {"params": jax.random.key(0)}, jnp.zeros((1, 8, 8, 3)), train=False))
  return seen


def test_moe_dropout_rate_sets_the_experts_dropout_only():
  """model.encoder.moe.dropout_rate: the experts' MLP dropout (the reference's MlpMoeBlock
  `dropout_rate`); None: encoder.dropout_rate, as before it existed."""
  cfg = tiny_config()
  cfg.encoder.dropout_rate = 0.1
  assert _expert_dropout_rates(cfg) == {"encoder/encoderblock_0/mlp": 0.1,
                                        "encoder/encoderblock_1/moe/experts": 0.1}
  cfg.encoder.moe.dropout_rate = 0.2
  assert _expert_dropout_rates(cfg) == {"encoder/encoderblock_0/mlp": 0.1,
                                        "encoder/encoderblock_1/moe/experts": 0.2}
  for bad in (1.0, -0.1, "0.2"):
    as_dict = cfg.to_dict()
    as_dict["encoder"]["moe"]["dropout_rate"] = bad
    with pytest.raises(ValueError, match=r"^model.encoder.moe.dropout_rate must be None .* "
                       r"or in \[0, 1\), got"):
      vnn.build_model(as_dict)


@pytest.mark.parametrize("key, value, message", [
    ("capacity_ceil_or_round", "floor", r"router.capacity_ceil_or_round must be one of "
     r"\['ceil', 'round'\], got 'floor'"),
    ("capacity_multiple_of", -1, r"router.capacity_multiple_of must be an integer >= 0, got -1"),
])
def test_capacity_options_bad_values_name_the_key(key, value, message):
  cfg = tiny_config()
  with cfg.unlocked():
    cfg.encoder.moe.router[key] = value
  with pytest.raises(ValueError, match="^model.encoder.moe." + message):
    vnn.build_model(cfg)


def test_capacity_rounding_to_zero_slots_fails_when_the_model_is_built():
  # S = 8, E = 4, K = 1, f = 0.2: round(0.4) = 0 slots (ceil: 1).
  cfg = tiny_config("topk", capacity_factor=0.2, capacity_ceil_or_round="round",
                    num_selected_experts=1)
  with pytest.raises(ValueError, match=r"^model.encoder.moe.router.capacity_factor=0.2 gives "
                     r"C = round\(8 \* 0.2 / 4\) = 0"):
    vnn.build_model(cfg)
  with pytest.raises(ValueError, match=r"^model.encoder.moe.router.capacity_multiple_of=1 does "
                     "not apply to soft_moe"):
    vnn.build_model(tiny_config("soft_moe", capacity_multiple_of=1))


# --- The Soft MoE recipe's options, each against an independent computation. ---


def _flat(tree):
  return {k: np.asarray(v) for k, v in flax.traverse_util.flatten_dict(tree, sep="/").items()}


def _layer_norm(x, scale=1.0, bias=0.0, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * scale + bias


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _attention(p, q_in, kv_in, qk_norm):
  """Multi-head attention in numpy from flax's parameter layout."""
  proj = {n: np.einsum("bnd,dhk->bnhk", q_in if n == "query" else kv_in, p[f"{n}/kernel"])
          + p[f"{n}/bias"] for n in ("query", "key", "value")}
  q, k = proj["query"], proj["key"]
  if qk_norm:  # Over each head's features, a scale and no bias.
    q, k = _layer_norm(q, p["query_ln/scale"]), _layer_norm(k, p["key_ln/scale"])
  logits = np.einsum("bqhk,bnhk->bhqn", q, k) / np.sqrt(q.shape[-1])
  out = np.einsum("bhqn,bnhk->bqhk", _softmax(logits), proj["value"])
  return np.einsum("bqhk,hkd->bqd", out, p["out/kernel"]) + p["out/bias"]


def _gelu(x):  # flax's nn.gelu (tanh approximation)
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _randomized(params, seed=1):
  """Every parameter moved at random (LayerNorm scales, biases, the probe): none trivial."""
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(seed), len(leaves))
  return jax.tree.unflatten(tree, [x + 0.5 * jax.random.normal(k, x.shape)
                                   for k, x in zip(keys, leaves)])


def test_qk_norm_attention_logits_by_hand():
  from vmoe_sparse_ot.nn.vit import EncoderBlock
  block = EncoderBlock(num_heads=2, mlp_dim=8, attention_qk_norm=True)
  x = jax.random.normal(jax.random.key(0), (2, 5, 8))
  params = _randomized(jax.jit(lambda: block.init(jax.random.key(1), x, False))()["params"])
  flat = _flat(params)
  assert flat["attention/query_ln/scale"].shape == (4,)   # D / heads, no bias
  assert "attention/query_ln/bias" not in flat
  _, state = jax.jit(lambda p: block.apply({"params": p}, x, False,
                                           capture_intermediates=True))(params)
  got = np.asarray(state["intermediates"]["attention"]["__call__"][0])
  y = _layer_norm(np.asarray(x), flat["norm_att/scale"], flat["norm_att/bias"])
  att = {k[len("attention/"):]: v for k, v in flat.items() if k.startswith("attention/")}
  np.testing.assert_allclose(got, _attention(att, y, y, True), rtol=2e-4, atol=2e-5)
  assert not np.allclose(got, _attention(att, y, y, False), atol=1e-3)


def test_sincos2d_is_its_formula_and_skips_the_class_token():
  from vmoe_sparse_ot.nn.vit import Encoder, sincos2d
  h, w, d, temperature = 2, 3, 12, 10_000.0
  want = np.zeros((h * w, d))
  q = d // 4
  for i in range(h):
    for j in range(w):
      for k in range(q):
        omega = temperature ** (-k / (q - 1))
        want[i * w + j, [k, q + k, 2 * q + k, 3 * q + k]] = [
            np.sin(j * omega), np.cos(j * omega), np.sin(i * omega), np.cos(i * omega)]
  np.testing.assert_allclose(np.asarray(sincos2d(h, w, d)), want, rtol=1e-5, atol=1e-6)
  # In the encoder (no blocks: its output is encoder_norm of its input): a class
  # token first gets nothing, the patches get the embedding; there are no parameters.
  enc = Encoder(num_layers=0, num_heads=2, mlp_dim=8, position_emb="sincos2d", grid=(h, w))
  x = jax.random.normal(jax.random.key(0), (2, 1 + h * w, d))
  variables = jax.jit(lambda: enc.init(jax.random.key(0), x, False))()
  assert set(_flat(variables["params"])) == {"encoder_norm/scale", "encoder_norm/bias"}
  got = np.asarray(jax.jit(lambda v: enc.apply(v, x, False)[0])(variables))
  x = np.asarray(x)
  np.testing.assert_allclose(got[:, :1], _layer_norm(x[:, :1]), atol=1e-5)
  np.testing.assert_allclose(got[:, 1:], _layer_norm(x[:, 1:] + want), atol=1e-5)


def test_map_head_is_attention_pooling_with_one_learned_probe():
  from vmoe_sparse_ot.nn.vit import MapHead
  head = MapHead(num_heads=2, mlp_dim=6)
  x = jax.random.normal(jax.random.key(0), (3, 5, 8))
  params = _randomized(jax.jit(lambda: head.init(jax.random.key(1), x))()["params"])
  flat = _flat(params)
  got = np.asarray(jax.jit(lambda p: head.apply({"params": p}, x))(params))
  probe = np.broadcast_to(flat["probe"], (3, 1, 8))
  att = {k[len("attention/"):]: v for k, v in flat.items() if k.startswith("attention/")}
  y = _attention(att, probe, np.asarray(x), False)
  z = _layer_norm(y, flat["norm/scale"], flat["norm/bias"])
  z = _gelu(z @ flat["mlp/Dense_0/kernel"] + flat["mlp/Dense_0/bias"])
  z = z @ flat["mlp/Dense_1/kernel"] + flat["mlp/Dense_1/bias"]
  np.testing.assert_allclose(got, (y + z)[:, 0], rtol=2e-4, atol=2e-5)


def test_gap_first_token_backbone_and_head_init():
  """gap: the mean of the encoder's tokens; '0': its first token, no class token;
  num_classes=None: no head, the representation in place of the logits; the head
  kernel starts at zero unless head_kernel_zero_init is False."""
  images = _images(2)
  outputs = {}
  for classifier, num_classes, zero in (("gap", None, True), ("0", 3, False)):
    cfg = tiny_config()
    cfg.name, cfg.classifier, cfg.num_classes = "vit", classifier, num_classes
    cfg.head_kernel_zero_init = zero
    model = vnn.build_model(cfg)
    params = _init(model, images)
    (out, aux), state = jax.jit(lambda p: model.apply(
        {"params": p}, images, capture_intermediates=True))(params)
    encoded = np.asarray(state["intermediates"]["encoder"]["__call__"][0][0])
    pooled = encoded.mean(axis=1) if classifier == "gap" else encoded[:, 0]
    np.testing.assert_allclose(np.asarray(aux["pre_logits"]), pooled, rtol=1e-6, atol=1e-6)
    assert "cls" not in params and encoded.shape[1] == 4   # 4 patches, no class token
    outputs[classifier] = (out, params)
  out, params = outputs["gap"]
  assert "head" not in params and out.shape == (2, 16)
  out, params = outputs["0"]
  assert out.shape == (2, 3) and np.abs(np.asarray(params["head"]["kernel"])).min() > 0


def test_soft_moe_s16_recipe_parameter_count_by_hand():
  """The Soft MoE S/16 (pretrain_jft4b.py 'soft-s16'): 128 experts of 1 slot in the last
  6 blocks, gap, qk-norm, learned position embeddings; abstract shapes only."""
  cfg = vnn.model_config.default_model_config()
  cfg.variant, cfg.classifier, cfg.num_classes = "S/16", "gap", 1000
  cfg.encoder.attention_qk_norm = True
  cfg.encoder.moe.layers = "6,7,8,9,10,11"
  cfg.encoder.moe.num_experts, cfg.encoder.moe.group_size = 128, 196
  cfg.encoder.moe.router.name = "soft_moe"
  cfg.encoder.moe.router.soft_moe.num_slots = 1
  model = vnn.build_model(cfg)
  shapes = jax.eval_shape(lambda: model.init({"params": jax.random.key(0)},
                                             jnp.zeros((1, 224, 224, 3)))["params"])
  got = sum(int(np.prod(s.shape)) for s in jax.tree.leaves(shapes))
  d, h, heads, e = 384, 1536, 6, 128
  embedding = 16 * 16 * 3 * d + d
  pos = 14 * 14 * d
  attention = 3 * (d * d + d) + (d * d + d) + 2 * (d // heads)   # + query_ln, key_ln
  norms = 2 * 2 * d
  mlp = d * h + h + h * d + d
  router = d * e * 1 + 1                                           # mu (D, E, slots), scale
  dense_block = norms + attention + mlp
  moe_block = norms + attention + e * mlp + router
  head = d * 1000 + 1000
  assert got == embedding + pos + 6 * dense_block + 6 * moe_block + 2 * d + head == 922_701_166


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["encoder"].__setitem__("position_emb", "rope"),
     r"model.encoder.position_emb must be one of \['learned', 'sincos2d', 'none'\], "
     r"got 'rope'"),
    (lambda c: c.__setitem__("classifier", "mean"), r"model.classifier must be one of"),
    (lambda c: c["encoder"]["moe"]["router"]["soft_moe"].__setitem__("num_slots", 2),
     r"model.encoder.moe.router.soft_moe.num_slots applies to the soft_moe router only "
     r"\(model.encoder.moe.router.name is 'topk'\); leave it at None, got 2"),
    (lambda c: c["encoder"].__setitem__("attention_qk_norm", 1),
     r"model.encoder.attention_qk_norm must be True or False, got 1"),
    (lambda c: c.__setitem__("num_classes", 0),
     r"model.num_classes must be an integer >= 1 or None"),
])
def test_bad_soft_moe_recipe_values_are_one_line_naming_the_key(edit, message):
  cfg = tiny_config("topk").to_dict()
  edit(cfg)
  with pytest.raises(ValueError, match="^" + message) as e:
    vnn.build_model(cfg)
  assert "\n" not in str(e.value)
