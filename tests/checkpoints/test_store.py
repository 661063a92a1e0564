"""Checkpoint writes on a multi-device mesh: small replicated arrays are written
whole (no slicing programs), large ones still by their replicas in parallel."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from tests import compile_profile
from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot import parallel
from vmoe_sparse_ot.train import state as state_lib


def _save_and_restore(params, workdir):
  mesh = parallel.make_mesh({'data': 8, 'expert': 1}, jax.devices()[:8], 1)
  replicated = parallel.replicated(mesh)
  params = jax.device_put(params, replicated)
  state = state_lib.create(params, optax.sgd(0.1), jax.random.key(0))
  state = jax.device_put(state, replicated)
  ckpt = checkpoints.Checkpointer(workdir, async_save=False)
  compiles = []
  with compile_profile.counting_compiles(compiles):
    ckpt.save(1, state, {'step': 1})
  ckpt.close()
  abstract = state_lib.with_shardings(jax.eval_shape(lambda: state),
                                      jax.tree.map(lambda _: replicated, state))
  restored, _ = checkpoints.Checkpointer(workdir).restore(abstract)
  for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  return len(compiles)


def test_small_replicated_arrays_are_saved_whole_and_large_ones_in_slices(tmp_path):
  rng = np.random.default_rng(0)
  small = {f'layer_{i}': {'bias': jnp.asarray(rng.standard_normal(32), jnp.float32)}
           for i in range(6)}
  # Each array's 8 replica slices would be 16 bytes: written whole, nothing compiled.
  assert _save_and_restore(small, str(tmp_path / 'small')) == 0
  # 8 slices of 1 MiB each: written in parallel, one slicing program per replica.
  slice_elems = checkpoints.MIN_REPLICA_SLICE_BYTES // 4
  large = {'kernel': jnp.asarray(rng.standard_normal((8, slice_elems)), jnp.float32)}
  assert _save_and_restore(large, str(tmp_path / 'large')) >= 8
