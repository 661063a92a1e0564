"""Released checkpoints whose weights do not say everything straight, taken as they are.

- An E³ model (M = 2 members) with the reference's router kernel (D, M, E/M), one
  (D, E/M) kernel per member, where this project's model holds (D, E).
- A Soft MoE model with 'sincos2d' position embeddings: no position-embedding
  parameter tells the image size, the config's dataset.image_size does. Its
  dispatcher moves tokens in bfloat16, as the reference's SoftRouter always does.

Each is written by the tests' own writer of the reference's partitioned format
(tests/evaluate/conftest.write_released), read by `load(checkpoint=, config=)` and
`evaluate --checkpoint`, and its logits compared with the reference model's forward
pass written out below in numpy from the reference's definitions.
"""
import json

import jax
import ml_dtypes
import numpy as np
import pytest

from tests.evaluate.conftest import write_released
from tests.train.helpers import small_config
from vmoe_sparse_ot import nn
from vmoe_sparse_ot.evaluate import job
from vmoe_sparse_ot.initialization import flatten_tree

D, HEADS, MLP, PATCH, BATCH, CLASSES = 8, 2, 16, 14, 8, 10
E3_EXPERTS, MEMBERS, SOFT_EXPERTS, SLOTS = 4, 2, 2, 2
SPLIT = 'test[:16]'


def e3_config():
  """E³-tiny: 2 blocks, block 1 an MoE layer of E = 4 experts, M = 2 members of 2, K = 1,
  C = S/M (nothing dropped), class token."""
  return small_config('router=topk', **{
      'model.hidden_size': D, 'model.encoder.num_layers': 2, 'model.encoder.num_heads': HEADS,
      'model.encoder.mlp_dim': MLP, 'model.patch_size': (PATCH, PATCH),
      'model.encoder.moe.layers': '1', 'model.encoder.moe.num_experts': E3_EXPERTS,
      'model.encoder.moe.group_size': 10, 'model.ensemble_size': MEMBERS,
      'model.encoder.moe.router.num_selected_experts': 1,
      'model.encoder.moe.router.capacity_factor': 2.0,
      'dataset.eval_split': SPLIT, 'eval_batch_size': BATCH})


def soft_config():
  """Soft MoE-tiny: sincos2d, 'gap' (no class token), block 1 a Soft MoE layer of E = 2
  experts with 2 slots each, one image's 4 tokens per group, bfloat16 dispatch."""
  return small_config('router=soft_moe', **{
      'model.hidden_size': D, 'model.encoder.num_layers': 2, 'model.encoder.num_heads': HEADS,
      'model.encoder.mlp_dim': MLP, 'model.patch_size': (PATCH, PATCH),
      'model.classifier': 'gap', 'model.encoder.position_emb': 'sincos2d',
      'model.encoder.moe.layers': '1', 'model.encoder.moe.num_experts': SOFT_EXPERTS,
      'model.encoder.moe.group_size': 4, 'model.encoder.moe.router.soft_moe.num_slots': SLOTS,
      'model.encoder.moe.routed_tokens_dtype': 'bfloat16',
      'dataset.eval_split': SPLIT, 'eval_batch_size': BATCH})


CONFIGS = {'e3': e3_config, 'soft': soft_config}


def _random_params(config, seed):
  """{our name: float32 array} of the model's shapes, N(0, 0.3^2) everywhere (a fresh init
  has a zero head and tiny biases, which would hide mistakes)."""
  model = nn.build_model(config.model)
  image = jax.ShapeDtypeStruct((1, 28, 28, 1), np.float32)
  shapes = jax.eval_shape(lambda x: model.init(jax.random.key(0), x, train=False), image)
  rng = np.random.default_rng(seed)
  return {k: (0.3 * rng.normal(size=v.shape)).astype(np.float32)
          for k, v in flatten_tree(shapes['params']).items()}


# --- the reference's forward pass, in numpy ------------------------------------------

def _ln(x, p, name):
  mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  return (x - mu) / np.sqrt(var + 1e-6) * p[f'{name}/scale'] + p[f'{name}/bias']


def _gelu(x):  # flax's default (tanh approximation), as both codes use
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def _softmax(x, axis):
  x = np.exp(x - x.max(axis=axis, keepdims=True))
  return x / x.sum(axis=axis, keepdims=True)


def _attention(x, p, name):
  q, k, v = (np.einsum('bnd,dhk->bnhk', x, p[f'{name}/{n}/kernel']) + p[f'{name}/{n}/bias']
             for n in ('query', 'key', 'value'))
  a = _softmax(np.einsum('bqhk,bshk->bhqs', q, k) / np.sqrt(D // HEADS), -1)
  o = np.einsum('bhqs,bshk->bqhk', a, v)
  return np.einsum('bqhk,hkd->bqd', o, p[f'{name}/out/kernel']) + p[f'{name}/out/bias']


def _mlp(x, w_in, b_in, w_out, b_out):
  return _gelu(x @ w_in + b_in) @ w_out + b_out


def _sincos2d(h, w):
  """[sin(j w_k), cos(j w_k), sin(i w_k), cos(i w_k)] of patch (i, j), w_k =
  10000^(-k / (D/4 - 1)): the reference's posemb_sincos2d."""
  omega = 1.0 / 10_000.0 ** (np.arange(D // 4) / (D // 4 - 1))
  i, j = np.mgrid[:h, :w]
  y, x = i.reshape(-1, 1) * omega, j.reshape(-1, 1) * omega
  return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)


def _bfloat16(x):
  return x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def _e3_moe(x, p, blk):
  """The reference's E³ MoE layer on (B*M, N, D), row b*M + m member m: top-1 among
  its own E/M experts by softmax(x W[:, m, :]), the output weighted by that gate."""
  router = p[f'{blk}/moe/router/kernel']                   # (D, M, E/M), its layout
  per_member = E3_EXPERTS // MEMBERS
  out = np.zeros_like(x)
  for r in range(x.shape[0]):
    m = r % MEMBERS
    gates = _softmax(x[r] @ router[:, m, :], -1)             # (N, E/M)
    for n, e in enumerate(gates.argmax(-1)):
      g = m * per_member + e
      out[r, n] = gates[n, e] * _mlp(x[r, n], *(p[f'{blk}/moe/experts/{k}'][g] for k in (
          'wi_kernel', 'wi_bias', 'wo_kernel', 'wo_bias')))
  return out


def _soft_moe(x, p, blk, bfloat16=True):
  """The reference's SoftRouter on one image per group (B, S, D), its dispatcher in
  bfloat16 (tokens rounded into the slots, expert outputs rounded into the combine)."""
  cast = _bfloat16 if bfloat16 else (lambda v: v)
  unit = lambda v, axis: v / np.sqrt((v ** 2).sum(axis, keepdims=True) + 1e-6)
  mu = unit(p[f'{blk}/moe/router/mu'].astype(np.float64), 0) * p[f'{blk}/moe/router/scale']
  logits = np.einsum('gsd,dec->gsec', unit(x, -1), mu)
  dispatch = _softmax(logits, 1)
  g, s, e, c = logits.shape
  combine = _softmax(logits.reshape(g, s, e * c), -1).reshape(g, s, e, c)
  slots = np.einsum('gsec,gsd->gecd', dispatch, cast(x))
  outs = np.stack([_mlp(slots[:, i], *(p[f'{blk}/moe/experts/{k}'][i] for k in (
      'wi_kernel', 'wi_bias', 'wo_kernel', 'wo_bias'))) for i in range(e)], 1)
  return np.einsum('gsec,gecd->gsd', combine, cast(outs))


def reference_logits(family, p, images, **moe_kwargs):
  """(B, classes) logits (an E³ model: (B, M, classes), each member's)."""
  p = {k: v.astype(np.float64) for k, v in p.items()}
  b = images.shape[0]
  patches = images.astype(np.float64).reshape(b, 2, PATCH, 2, PATCH, 1).transpose(
      0, 1, 3, 2, 4, 5).reshape(b, 4, PATCH * PATCH)
  x = patches @ p['embedding/kernel'].reshape(-1, D) + p['embedding/bias']
  if family == 'e3':
    x = np.concatenate([np.repeat(p['cls'], b, 0), x], 1) + p['encoder/pos_embedding']
  else:
    x = x + _sincos2d(2, 2)
  for i in range(2):
    blk = f'encoder/encoderblock_{i}'
    x = x + _attention(_ln(x, p, f'{blk}/norm_att'), p, f'{blk}/attention')
    y = _ln(x, p, f'{blk}/norm_mlp')
    if i == 0:
      x = x + _mlp(y, *(p[f'{blk}/mlp/Dense_{j}/{k}'] for j in (0, 1) for k in ('kernel', 'bias')))
    elif family == 'e3':
      x = np.repeat(x, MEMBERS, 0)              # the members, from the first MoE layer on
      x = x + _e3_moe(np.repeat(y, MEMBERS, 0), p, blk)
    else:
      x = x + _soft_moe(y, p, blk, **moe_kwargs)
  x = _ln(x, p, 'encoder/encoder_norm')
  pooled = x[:, 0] if family == 'e3' else x.mean(1)
  logits = pooled @ p['head/kernel'] + p['head/bias']
  return logits.reshape(b, MEMBERS, CLASSES) if family == 'e3' else logits


# --- fixtures ----------------------------------------------------------------------------

@pytest.fixture(scope='module', params=sorted(CONFIGS))
def family(request, tmp_path_factory):
  """(name, prefix, config file, {our name: array}) of a released checkpoint written in
  the reference's layout (E³: its router kernel (D, M, E/M))."""
  name = request.param
  params = _random_params(CONFIGS[name](), seed=7)
  written = dict(params)
  if name == 'e3':
    router = 'encoder/encoderblock_1/moe/router/kernel'
    written[router] = params[router].reshape(D, MEMBERS, E3_EXPERTS // MEMBERS)
  folder = tmp_path_factory.mktemp(f'released_{name}')
  write_released(written, str(folder / name))
  config = folder / f'{name}.py'
  config.write_text('from tests.evaluate.test_released_families import '
                    f'{name}_config\n\n\ndef get_config():\n  return {name}_config()\n')
  return name, str(folder / name), str(config), written


@pytest.fixture(scope='module')
def images():
  """The job's first eval batches (SPLIT), as the eval pipeline makes them."""
  from vmoe_sparse_ot import data  # pylint: disable=g-import-not-at-top
  ds = data.make_dataset('embedded_mnist', SPLIT, batch_size=BATCH, image_size=28, channels=1,
                         training=False, process_index=0, process_count=1, augment='none')
  batches = list(ds.as_numpy_iterator())
  return (np.concatenate([b['image'] for b in batches]),
          np.concatenate([b['label'] for b in batches]))


# --- the tests ---------------------------------------------------------------------------

def test_load_gives_the_reference_logits(family, images):
  import vmoe_sparse_ot  # pylint: disable=g-import-not-at-top
  name, prefix, config, written = family
  m = vmoe_sparse_ot.load(checkpoint=prefix, config=config, batch_size=BATCH)
  assert m.image_shape == (28, 28, 1) and m.num_tokens == (5 if name == 'e3' else 4)
  want = reference_logits(name, written, images[0])
  got = m.outputs(images[0])
  np.testing.assert_allclose(got['member_logits' if name == 'e3' else 'logits'], want,
                             rtol=1e-6, atol=2e-6)
  if name == 'e3':  # The model's (D, E) kernel: member m's columns m*E/M, ...
    kernel = flatten_tree(m.params)['encoder/encoderblock_1/moe/router/kernel']
    np.testing.assert_array_equal(kernel[:, 2:], written[
        'encoder/encoderblock_1/moe/router/kernel'][:, 1])
  else:  # The bfloat16 dispatch shows: in float32 the same model is 10x the tolerance off.
    assert np.abs(reference_logits(name, written, images[0], bfloat16=False) - want).max() > 2e-5


def test_evaluate_checkpoint_gives_the_reference_loss_and_accuracy(family, images, capsys):
  name, prefix, config, written = family
  job.main(['evaluate', f'--checkpoint={prefix}', f'--config={config}',
            f'--batch_size={BATCH}'])
  payload = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert payload['dataset']['image_shape'] == [28, 28, 1]
  assert payload['dataset']['num_examples'] == 16
  want = reference_logits(name, written, images[0])
  # An E³ model is evaluated by its members' mean probability, as there.
  probs = _softmax(want, -1).mean(1) if name == 'e3' else _softmax(want, -1)
  labels = images[1]
  assert payload['metrics']['accuracy'] == np.mean(probs.argmax(-1) == labels)
  assert payload['metrics']['loss'] == pytest.approx(
      -np.log(probs[np.arange(16), labels]).mean(), rel=1e-5)


def test_a_reshaped_or_sizeless_checkpoint_still_must_be_the_configs_model(family):
  """A layout of the same parameters is read; anything else is still refused, and a
  model with no position embedding needs the config's image size."""
  import vmoe_sparse_ot  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.evaluate import released  # pylint: disable=g-import-not-at-top
  name, prefix, _, _ = family
  config = CONFIGS[name]()
  if name == 'e3':   # Its (D, 2, 2) router kernel (and 4 experts) do not fit 6 experts.
    config.model.encoder.moe.num_experts = 6
    with pytest.raises(ValueError, match=r"checkpoint=.*does not fit the config's model"):
      vmoe_sparse_ot.load(checkpoint=prefix, config=config)
  else:
    with pytest.raises(ValueError, match='no encoder/pos_embedding among the parameters'):
      released.read_weights(prefix, config.model.to_dict())
