"""Compiled per-device memory of the paper configs' train step, per memory lever.

Builds configs/vmoe_b32.py or vmoe_b16.py (default router, the paper's batch),
lowers and compiles the trainer's sharded train step on 8 fake CPU devices
(`--xla_force_host_platform_device_count=8`), or on an accelerator on the devices
it has, with abstract arguments only
(`jax.eval_shape`: no parameter is ever materialised), and reads XLA's
`memory_analysis()` of the compiled step: per-device argument, output, temp
(activations and other scratch) and generated-code bytes. The state is donated,
as in the trainer, so its output buffers alias the argument ones; the peak is
taken as argument + temp + generated code (+ output not aliased).

Rows: plain (the config as it is), remat (model.remat), bf16 (model.dtype),
remat_bf16 (both), microsteps4 (config.microsteps = 4), all (remat + bf16 +
microsteps 4 + optimizer.mu_dtype bfloat16).

A second measure, backend-independent, is the bytes of activations the step
keeps from its forward pass for its backward pass (the residuals of
`jax.vjp` of the loss for one microbatch, traced with `jax.eval_shape`), per
device. XLA:CPU's `temp` does not follow remat and bfloat16 the way an
accelerator's would: XLA:CPU converts bfloat16 operands to float32 around every
matrix product (the products and their outputs are float32 buffers), and its
default scheduler orders work for parallelism, not memory, so it may run a
rematerialised forward early. So `temp` is XLA:CPU's estimate, not an
accelerator's; the saved activations are what remat and bfloat16 cut. One
row compiles in 0.5 to 1.5 minutes on this project's 2-core machine.

    python benchmarks/memory.py [--config vmoe_b32] [--rows plain,remat,...]
        [--batch_size N] [--json out.json]
"""
import argparse
import json
import os
import sys
import time

os.environ['XLA_FLAGS'] = (os.environ.get('XLA_FLAGS', '') +
                           ' --xla_force_host_platform_device_count=8').strip()
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # pylint: disable=wrong-import-position
import jax.numpy as jnp  # pylint: disable=wrong-import-position

from vmoe_sparse_ot import nn  # pylint: disable=wrong-import-position
from vmoe_sparse_ot import config as config_lib  # pylint: disable=wrong-import-position
from vmoe_sparse_ot.train import optimizer as optimizer_lib  # pylint: disable=wrong-import-position
from vmoe_sparse_ot import parallel  # pylint: disable=wrong-import-position
from vmoe_sparse_ot.train import state as state_lib  # pylint: disable=wrong-import-position
from vmoe_sparse_ot.train import step as step_lib  # pylint: disable=wrong-import-position
from vmoe_sparse_ot.train import mixup as mixup_lib  # pylint: disable=wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1024 ** 3
ROWS = {
    'plain': {},
    'remat': {'model.remat': True},
    'bf16': {'model.dtype': 'bfloat16'},
    'remat_bf16': {'model.remat': True, 'model.dtype': 'bfloat16'},
    'microsteps4': {'microsteps': 4},
    'all': {'model.remat': True, 'model.dtype': 'bfloat16', 'microsteps': 4,
            'optimizer.mu_dtype': 'bfloat16'},
}


def build_config(name: str, overrides: dict, batch_size: int | None):
  config = config_lib.load_config_file(os.path.join(ROOT, 'configs', f'{name}.py'))
  if batch_size:
    config.batch_size = batch_size
  for key, value in overrides.items():
    node = config
    *path, leaf = key.split('.')
    for part in path:
      node = node[part]
    node[leaf] = value
  config_lib.validate(config)
  return config


def compile_step(config):
  """The trainer's jitted train step for `config`, compiled on the 8 devices."""
  model = nn.build_model(config.model)
  num_experts = config.model.encoder.moe.num_experts if config.model.name == 'vit_moe' else 1
  mesh = parallel.make_mesh(config.mesh, jax.devices(), num_experts)
  ds = config.dataset
  image_shape = (1, ds.image_size, ds.image_size, ds.channels)

  def init_variables(key):  # (params, model_state: router state, e.g. topk_bias's bias)
    return nn.router_state.split(model.init({'params': key}, jnp.zeros(image_shape),
                                            train=False))

  init_params = lambda key: init_variables(key)[0]

  schedule = optimizer_lib.make_schedule(config.schedule, int(config.train_steps))
  key = jax.random.key(0)
  abstract_params = jax.eval_shape(init_params, key)
  tx = optimizer_lib.make_optimizer(config.optimizer, schedule, abstract_params)

  def init_state():
    params, model_state = init_variables(key)
    return state_lib.create(params, tx, key, model_state)

  abstract_state = jax.eval_shape(init_state)
  state_sharding = state_lib.shardings_on_mesh(mesh, tx, abstract_state)
  batch_sharding = parallel.batch_sharding(mesh)
  b = int(config.batch_size)
  batch = {'image': jax.ShapeDtypeStruct((b, ds.image_size, ds.image_size, ds.channels),
                                         jnp.float32, sharding=batch_sharding),
           'label': jax.ShapeDtypeStruct((b,), jnp.int32, sharding=batch_sharding)}
  state = state_lib.with_shardings(abstract_state, state_sharding)
  step = jax.jit(step_lib.make_step(model, tx, float(config.label_smoothing),
                                   int(config.microsteps), config.loss.name,
                                   mixup_lib.Mixup(float(config.mixup.p))),
                 in_shardings=(state_sharding, batch_sharding),
                 out_shardings=(state_sharding, parallel.replicated(mesh)),
                 donate_argnums=(0,))
  with jax.set_mesh(mesh):
    lowered = step.lower(state, batch)
  return lowered.compile(), saved_for_backward(model, abstract_params, config,
                                               abstract_state.model_state)


def saved_for_backward(model, abstract_params, config, model_state=None) -> int:
  """Bytes JAX keeps from the forward pass for the backward pass, for one microbatch.

  The residuals of `jax.vjp` of the training loss, traced with `jax.eval_shape`
  (nothing is computed): the activations a step must hold at its peak, as the
  program defines them before any backend's scheduling. Every device holds its
  share of them (split by batch, or by expert for expert buffers).
  """
  ds = config.dataset
  b = int(config.batch_size) // int(config.microsteps)
  images = jax.ShapeDtypeStruct((b, ds.image_size, ds.image_size, ds.channels), jnp.float32)

  def residuals(params, model_state, images):
    def loss(p):
      logits, aux = model.apply({'params': p, **model_state}, images, train=True,
                                rngs={'dropout': jax.random.key(0), 'gating': jax.random.key(1)})
      return jnp.mean(jax.nn.logsumexp(logits, axis=-1)) + aux['auxiliary_loss']
    return jax.vjp(loss, params)[1]

  shapes = jax.eval_shape(residuals, abstract_params, model_state or {}, images)
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(shapes))


def measure(name: str, row: str, batch_size: int | None, common: dict | None = None) -> dict:
  config = build_config(name, {**(common or {}), **ROWS[row]}, batch_size)
  start = time.time()
  compiled, saved = compile_step(config)
  seconds = time.time() - start
  m = compiled.memory_analysis()
  out = {
      'config': name, 'row': row, 'batch_size': int(config.batch_size),
      'compile_seconds': round(seconds, 1),
      'saved_per_device': saved // jax.device_count(),
      'argument': m.argument_size_in_bytes, 'output': m.output_size_in_bytes,
      'alias': m.alias_size_in_bytes, 'temp': m.temp_size_in_bytes,
      'code': m.generated_code_size_in_bytes,
  }
  out['peak'] = out['argument'] + out['output'] - out['alias'] + out['temp'] + out['code']
  return out


def table(results: list) -> str:
  plain = {r['config']: r for r in results if r['row'] == 'plain'}
  lines = ['| config | row | args GiB | temp GiB | peak GiB | temp / plain | peak / plain '
           '| fits 16 GiB | fits 80 GiB | saved for bwd GiB | saved / plain | compile s |',
           '|---|---|---|---|---|---|---|---|---|---|---|---|']
  for r in results:
    base = plain.get(r['config'])
    ratio = lambda k: f'{r[k] / base[k]:.2f}' if base else '-'
    lines.append(
        f"| {r['config']} b{r['batch_size']} | {r['row']} | {r['argument'] / GIB:.2f} "
        f"| {r['temp'] / GIB:.2f} | {r['peak'] / GIB:.2f} | {ratio('temp')} | {ratio('peak')} "
        f"| {'yes' if r['peak'] <= 16 * GIB else 'no'} "
        f"| {'yes' if r['peak'] <= 80 * GIB else 'no'} "
        f"| {r['saved_per_device'] / GIB:.2f} | {ratio('saved_per_device')} "
        f"| {r['compile_seconds']} |")
  return '\n'.join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--config', default='vmoe_b32', help='vmoe_b32 or vmoe_b16')
  parser.add_argument('--rows', default=','.join(ROWS))
  parser.add_argument('--batch_size', type=int, default=None,
                      help="global batch (default: the config's, the paper's 4096)")
  parser.add_argument('--set', action='append', default=[], metavar='KEY=VALUE',
                      help='a config override for every row (VALUE read as JSON, else '
                           'a string), e.g. --set model.encoder.moe.router.name=topk')
  parser.add_argument('--json', default=None, help='also write the results here')
  args = parser.parse_args()
  common = {}
  for item in args.set:
    key, _, value = item.partition('=')
    try:
      common[key] = json.loads(value)
    except json.JSONDecodeError:
      common[key] = value
  devices = jax.devices()
  if devices[0].platform == 'cpu':  # the forced 8 fake devices
    assert len(devices) == 8, devices
  print(f'{len(devices)} x {devices[0].device_kind} ({devices[0].platform}), JAX '
        f'{jax.__version__}: the global batch is split evenly over the devices\' '
        "'data' axis, the experts over its 'expert' axis (config.mesh)", flush=True)
  results = []
  for config in args.config.split(','):
    for row in args.rows.split(','):
      results.append(measure(config, row, args.batch_size, common))
      print(json.dumps(results[-1]), file=sys.stderr, flush=True)
  print(table(results))
  if args.json:
    with open(args.json, 'w') as f:
      json.dump(results, f, indent=1)


if __name__ == '__main__':
  main()
