"""Initialization on real models: upcycling computes s x the dense MLP, a hand-built
public-ViT .npz gives the logits of an independent numpy ViT, export round trips, a
reference partitioned checkpoint loads, and fine-tuning defaults fire."""
import jax
import numpy as np
import pytest

from vmoe_sparse_ot import initialization, nn
from vmoe_sparse_ot.export import exported_arrays
from vmoe_sparse_ot.initialization import names
from vmoe_sparse_ot.nn.model_config import default_model_config
from vmoe_sparse_ot.nn.moe import MoeLayer
from vmoe_sparse_ot.nn.vit import MlpBlock
from tests.initialization.test_partitioned import build, dump

D, HEADS, MLP, E, LAYERS, PATCH = 16, 2, 32, 4, 2, 7


def model_config(name='vit_moe', num_classes=10, router='topk'):
  c = default_model_config()
  c.name, c.num_classes, c.hidden_size, c.patch_size = name, num_classes, D, (PATCH, PATCH)
  c.encoder.num_layers, c.encoder.num_heads, c.encoder.mlp_dim = LAYERS, HEADS, MLP
  c.encoder.moe.num_experts, c.encoder.moe.group_size = E, 10
  c.encoder.moe.router.name = router
  return c


def init_flat(config, image_size=14, seed=0):
  """(model, {name: random float32 array}) with the model's parameter shapes.

  Random everywhere (a fresh init has a zero head and near-zero biases, which
  would hide mistakes); shapes from `eval_shape`, so nothing compiles.
  """
  model = nn.build_model(config)
  x = jax.ShapeDtypeStruct((1, image_size, image_size, 3), np.float32)
  shapes = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False)['params'], x)
  rng = np.random.default_rng(seed)
  return model, {k: (0.3 * rng.normal(size=v.shape)).astype(np.float32)
                 for k, v in initialization.flatten_tree(shapes).items()}


_APPLY = {}


def logits(model, flat, images):
  """Eval logits, jitted once per model."""
  key = repr(model)   # Modules holding dicts are not hashable.
  if key not in _APPLY:
    _APPLY[key] = jax.jit(lambda p, x: model.apply({'params': p}, x, train=False)[0])
  return np.asarray(_APPLY[key](initialization.unflatten(flat), images))


def images(n=3, size=14, seed=2):
  return np.random.default_rng(seed).normal(size=(n, size, size, 3)).astype(np.float32)


@pytest.mark.parametrize('router', ['topk', 'sparse_ot'])
def test_upcycled_layer_gives_s_times_the_dense_mlp(router):
  _, dense = init_flat(model_config('vit'))
  _, moe = init_flat(model_config('vit_moe', router=router), seed=3)
  mapped = initialization.map_onto(dense, {k: v.shape for k, v in moe.items()},
                                   num_prefix_tokens=1)
  assert mapped.uninitialized == [] and mapped.unused == []
  blk = 'encoder/encoderblock_1'
  for ours, dense_name in (('wi_kernel', 'Dense_0/kernel'), ('wi_bias', 'Dense_0/bias'),
                           ('wo_kernel', 'Dense_1/kernel'), ('wo_bias', 'Dense_1/bias')):
    for e in range(E):
      np.testing.assert_array_equal(mapped.params[f'{blk}/moe/experts/{ours}'][e],
                                    dense[f'{blk}/mlp/{dense_name}'])
  for name, value in mapped.params.items():
    if '/moe/' not in name:
      np.testing.assert_array_equal(value, dense[name])
  # The layer alone on a batch: 30 tokens in 3 groups of 10, capacity 4 per expert,
  # so some tokens are dropped (s = 0) and others get one or two experts.
  cfg = model_config('vit_moe', router=router).encoder.moe.router
  cfg.capacity_factor = 0.8
  layer = MoeLayer(num_experts=E, mlp_dim=MLP, group_size=10,
                   router=nn.parse_router_options(cfg))
  x = np.random.default_rng(4).normal(size=(3, 10, D)).astype(np.float32)
  params = {'router': {'kernel': 5 * moe[f'{blk}/moe/router/kernel']},
            'experts': {k: mapped.params[f'{blk}/moe/experts/{k}']
                        for k in ('wi_kernel', 'wi_bias', 'wo_kernel', 'wo_bias')}}
  (y, _, _), state = jax.jit(lambda p, x: layer.apply(
      {'params': p}, x, train=False, mutable=['intermediates']))(params, x)
  (weights,) = state['intermediates']['expert_weights']               # (G, S, E)
  s = np.asarray(weights).sum(-1).reshape(3, 10, 1)
  mlp = {'Dense_0': {'kernel': dense[f'{blk}/mlp/Dense_0/kernel'],
                     'bias': dense[f'{blk}/mlp/Dense_0/bias']},
         'Dense_1': {'kernel': dense[f'{blk}/mlp/Dense_1/kernel'],
                     'bias': dense[f'{blk}/mlp/Dense_1/bias']}}
  want = s * np.asarray(jax.jit(lambda p, x: MlpBlock(MLP).apply({'params': p}, x, train=False))(
      mlp, x))
  assert (s > 0).any() and (router != 'topk' or (s == 0).any())   # TopK drops some.
  np.testing.assert_allclose(np.asarray(y), want, rtol=2e-5, atol=2e-6)


def test_shared_experts_count_by_hand_and_upcycled_dropless_layer_gives_s_plus_2_times_dense():
  """2 shared experts hold 2 (D H + H + H D + D) parameters; upcycling copies the
  dense MLP into them as into the routed experts, so the dropless layer (nothing
  dropped) computes (s + 2) times the dense MLP, s the token's combine weights."""
  _, dense = init_flat(model_config('vit'))
  config = model_config('vit_moe')
  config.encoder.moe.num_shared_experts = 2
  config.encoder.moe.dispatcher = 'dropless'
  _, moe = init_flat(config, seed=3)
  _, plain = init_flat(model_config('vit_moe'), seed=3)
  blk = 'encoder/encoderblock_1'
  shared = {k: v for k, v in moe.items() if k.startswith(f'{blk}/moe/shared_experts/')}
  assert sum(v.size for v in shared.values()) == 2 * (D * MLP + MLP + MLP * D + D) == 2144
  assert sum(v.size for v in moe.values()) - sum(v.size for v in plain.values()) == 2144
  mapped = initialization.map_onto(dense, {k: v.shape for k, v in moe.items()},
                                   num_prefix_tokens=1)
  assert mapped.uninitialized == [] and mapped.unused == []
  assert 'into 4 experts and 2 shared expert(s) each' in mapped.log[0]
  layer = MoeLayer(num_experts=E, mlp_dim=MLP, group_size=10, dispatcher='dropless',
                   num_shared_experts=2, router=nn.parse_router_options(
                       config.encoder.moe.router))
  x = np.random.default_rng(4).normal(size=(3, 10, D)).astype(np.float32)
  params = {'router': {'kernel': 5 * moe[f'{blk}/moe/router/kernel']}}
  for part in ('experts', 'shared_experts'):
    params[part] = {k: mapped.params[f'{blk}/moe/{part}/{k}']
                    for k in ('wi_kernel', 'wi_bias', 'wo_kernel', 'wo_bias')}
  (y, _, _), state = jax.jit(lambda p, x: layer.apply(
      {'params': p}, x, train=False, mutable=['intermediates']))(params, x)
  s = np.asarray(state['intermediates']['expert_weights'][0]).sum(-1).reshape(3, 10, 1)
  mlp = {f'Dense_{i}': {'kernel': dense[f'{blk}/mlp/Dense_{i}/kernel'],
                        'bias': dense[f'{blk}/mlp/Dense_{i}/bias']} for i in (0, 1)}
  want = (s + 2) * np.asarray(jax.jit(lambda p, x: MlpBlock(MLP).apply(
      {'params': p}, x, train=False))(mlp, x))
  assert (s > 0).all()   # dropless: every token gets its K experts
  np.testing.assert_allclose(np.asarray(y), want, rtol=2e-5, atol=5e-6)


# --------------------------------------------------- a public ViT .npz, written by hand

def _public_vit_shapes(num_classes=10, tokens=5):
  shapes = {'embedding/kernel': (PATCH, PATCH, 3, D), 'embedding/bias': (D,),
            'cls': (1, 1, D), 'Transformer/posembed_input/pos_embedding': (1, tokens, D),
            'Transformer/encoder_norm/scale': (D,), 'Transformer/encoder_norm/bias': (D,),
            'head/kernel': (D, num_classes), 'head/bias': (num_classes,)}
  for i in range(LAYERS):
    b = f'Transformer/encoderblock_{i}'
    for ln in ('LayerNorm_0', 'LayerNorm_2'):
      shapes[f'{b}/{ln}/scale'] = shapes[f'{b}/{ln}/bias'] = (D,)
    for proj in ('query', 'key', 'value'):
      shapes[f'{b}/MultiHeadDotProductAttention_1/{proj}/kernel'] = (D, HEADS, D // HEADS)
      shapes[f'{b}/MultiHeadDotProductAttention_1/{proj}/bias'] = (HEADS, D // HEADS)
    shapes[f'{b}/MultiHeadDotProductAttention_1/out/kernel'] = (HEADS, D // HEADS, D)
    shapes[f'{b}/MultiHeadDotProductAttention_1/out/bias'] = (D,)
    mlp = f'{b}/MlpBlock_3'
    shapes[f'{mlp}/Dense_0/kernel'], shapes[f'{mlp}/Dense_0/bias'] = (D, MLP), (MLP,)
    shapes[f'{mlp}/Dense_1/kernel'], shapes[f'{mlp}/Dense_1/bias'] = (MLP, D), (D,)
  return shapes


def _numpy_vit(p, x):
  """The ViT forward pass in numpy, from the public file's names (pre-LN, token head)."""
  def ln(v, name):
    mu, var = v.mean(-1, keepdims=True), v.var(-1, keepdims=True)
    return (v - mu) / np.sqrt(var + 1e-6) * p[f'{name}/scale'] + p[f'{name}/bias']
  gelu = lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))
  b, h, w, c = x.shape
  patches = x.reshape(b, h // PATCH, PATCH, w // PATCH, PATCH, c).transpose(0, 1, 3, 2, 4, 5)
  t = patches.reshape(b, -1, PATCH * PATCH * c) @ p['embedding/kernel'].reshape(-1, D)
  t = t + p['embedding/bias']
  t = np.concatenate([np.repeat(p['cls'], b, 0), t], 1)
  t = t + p['Transformer/posembed_input/pos_embedding']
  for i in range(LAYERS):
    blk = f'Transformer/encoderblock_{i}'
    att = f'{blk}/MultiHeadDotProductAttention_1'
    y = ln(t, f'{blk}/LayerNorm_0')
    q, k, v = (np.einsum('bnd,dhk->bnhk', y, p[f'{att}/{n}/kernel']) + p[f'{att}/{n}/bias']
               for n in ('query', 'key', 'value'))
    a = np.einsum('bqhk,bshk->bhqs', q, k) / np.sqrt(D // HEADS)
    a = np.exp(a - a.max(-1, keepdims=True))
    a = a / a.sum(-1, keepdims=True)
    o = np.einsum('bhqs,bshk->bqhk', a, v)
    t = t + np.einsum('bqhk,hkd->bqd', o, p[f'{att}/out/kernel']) + p[f'{att}/out/bias']
    y = ln(t, f'{blk}/LayerNorm_2')
    y = gelu(y @ p[f'{blk}/MlpBlock_3/Dense_0/kernel'] + p[f'{blk}/MlpBlock_3/Dense_0/bias'])
    t = t + y @ p[f'{blk}/MlpBlock_3/Dense_1/kernel'] + p[f'{blk}/MlpBlock_3/Dense_1/bias']
  t = ln(t, 'Transformer/encoder_norm')
  return t[:, 0] @ p['head/kernel'] + p['head/bias']


def test_hand_built_public_vit_npz_loads_with_nothing_unmatched(tmp_path):
  rng = np.random.default_rng(0)
  public = {k: (0.2 * rng.normal(size=s)).astype(np.float32)
            for k, s in _public_vit_shapes().items()}
  np.savez(tmp_path / 'ViT-tiny.npz', **public)
  model, fresh = init_flat(model_config('vit'))
  out, mapped = initialization.initialize(
      fresh, {'path': str(tmp_path / 'ViT-tiny.npz'), 'raise_if_target_unmatched': True,
              'raise_if_source_unmatched': True}, num_prefix_tokens=1, log=lambda _: None)
  assert mapped.uninitialized == [] and mapped.unused == [] and len(out) == len(public)
  x = images()
  np.testing.assert_allclose(logits(model, out, x), _numpy_vit(public, x.astype(np.float64)),
                             rtol=1e-4, atol=2e-5)


# ----------------------------------------------------------------- export round trips

def test_export_then_initialize_is_bit_identical(tmp_path):
  model, params = init_flat(model_config('vit_moe'))
  arrays = exported_arrays(initialization.unflatten(params), 'vit')
  assert 'Transformer/encoderblock_1/Moe/Mlp/Dense_0/kernel' in arrays
  assert arrays['Transformer/encoderblock_1/Moe/Router/dense/kernel'].shape == (D, E)
  initialization.write_npz(str(tmp_path / 'w.npz'), arrays)
  _, fresh = init_flat(model_config('vit_moe'), seed=5)
  out, mapped = initialization.initialize(
      fresh, {'path': str(tmp_path / 'w.npz'), 'raise_if_source_unmatched': True},
      num_prefix_tokens=1, log=lambda _: None)
  assert mapped.log == []
  for k in params:
    np.testing.assert_array_equal(out[k], params[k])
  x = images()
  np.testing.assert_array_equal(logits(model, out, x), logits(model, params, x))


def test_reference_partitioned_checkpoint_initializes_the_vmoe(tmp_path):
  model, params = init_flat(model_config('vit_moe'))
  ref = {names.from_ours(k, 'vmoe'): v for k, v in params.items()}
  assert 'Encoder/encoderblock_1/Moe/Router/dense/kernel' in ref
  layout = {}
  for k, v in ref.items():
    whole = tuple((0, d) for d in v.shape)
    if '/Moe/Mlp/' in k:   # One chunk per expert, spread over both shards.
      layout[k] = [(((e, e + 1),) + whole[1:], e % 2) for e in range(E)]
    else:
      layout[k] = [(whole, 0)]
  dump(str(tmp_path / 'vmoe.ckpt'), *build(ref, layout, 2))
  _, fresh = init_flat(model_config('vit_moe'), seed=5)
  out, _ = initialization.initialize(
      fresh, {'path': str(tmp_path / 'vmoe.ckpt'), 'raise_if_source_unmatched': True},
      num_prefix_tokens=1, log=lambda _: None)
  for k in params:
    np.testing.assert_array_equal(out[k], params[k])


def test_fine_tuning_defaults_zoom_and_new_head(tmp_path):
  _, params = init_flat(model_config('vit'))
  initialization.write_npz(str(tmp_path / 'dense.npz'),
                           exported_arrays(initialization.unflatten(params), 'vit'))
  # V-MoE at 21 x 21 (a 3 x 3 grid instead of 2 x 2) with 5 classes, from the dense ViT.
  _, fresh = init_flat(model_config('vit_moe', num_classes=5), image_size=21)
  lines = []
  out, mapped = initialization.initialize(
      fresh, {'path': str(tmp_path / 'dense.npz')}, num_prefix_tokens=1, log=lines.append)
  text = '\n'.join(lines)
  assert 'upcycled 1 MoE layer(s)' in text
  assert 'position embedding resized from a 2x2 to a 3x3 patch grid' in text
  assert 'head re-initialized' in text
  np.testing.assert_array_equal(out['head/kernel'], fresh['head/kernel'])   # The target's own.
  assert out['encoder/pos_embedding'].shape == (1, 10, D)
  np.testing.assert_array_equal(out['encoder/pos_embedding'][0, 0],
                                params['encoder/pos_embedding'][0, 0])


# --------------------------------------------------------------- V-MoE into E³

def test_vmoe_weights_initialize_an_e3_model_with_every_parameter_accounted_for(tmp_path):
  """E³ (M=2) has the V-MoE's parameters, names and shapes: member m owns experts
  2m, 2m+1 and router columns 2m, 2m+1. A V-MoE's exported weights initialize
  every one of them as they are, and use every source entry; the reference's E³
  router kernel (D, M, E/M) is reshaped onto (D, E)."""
  _, params = init_flat(model_config('vit_moe'))
  initialization.write_npz(str(tmp_path / 'vmoe.npz'),
                           exported_arrays(initialization.unflatten(params), 'vit'))
  e3_config = model_config('vit_moe')
  e3_config.ensemble_size = 2
  _, fresh = init_flat(e3_config, seed=5)
  assert {k: v.shape for k, v in fresh.items()} == {k: v.shape for k, v in params.items()}
  out, mapped = initialization.initialize(
      fresh, {'path': str(tmp_path / 'vmoe.npz'), 'raise_if_target_unmatched': True,
              'raise_if_source_unmatched': True}, num_prefix_tokens=1, log=lambda _: None)
  assert mapped.log == [] and mapped.uninitialized == [] and mapped.unused == []
  assert sorted(mapped.sources) == sorted(fresh)
  for k in params:
    np.testing.assert_array_equal(out[k], params[k])
  router = 'encoder/encoderblock_1/moe/router/kernel'
  reference = {**params, router: params[router].reshape(D, 2, E // 2)}
  got = initialization.map_onto(reference, {k: v.shape for k, v in fresh.items()},
                                num_prefix_tokens=1)
  np.testing.assert_array_equal(got.params[router], params[router])
  assert got.log == [f'{router}: an E³ router kernel ({D}, 2, {E // 2}) (D, M, E/M) reshaped '
                     f'to ({D}, {E})']
