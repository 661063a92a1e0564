"""Trainer tests share a persistent XLA compilation cache (also with their subprocesses).

Most of a short test run is compilation; identical programs (the same config on
the same mesh, in-process or in a CLI subprocess) then compile once per session.
"""
import os
import tempfile

import jax

CACHE_DIR = os.path.join(tempfile.gettempdir(), 'vmoe_sparse_ot_test_xla_cache')
os.environ['JAX_COMPILATION_CACHE_DIR'] = CACHE_DIR
jax.config.update('jax_compilation_cache_dir', CACHE_DIR)
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)


# --- Trained runs shared by several test files (session scope: once per pytest-xdist
# worker that needs one). ---------------------------------------------------------------
import pytest  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(scope='session')
def topk_six_steps(tmp_path_factory):
  """(workdir, summary) of `small_config('router=topk', **helpers.SIX_STEPS)` on one device.

  The reference run of test_routers.py (the 8-device mesh matches it) and of
  test_multiprocess.py (two processes match it). Read-only for its users.
  """
  from tests.train import helpers  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.train import trainer  # pylint: disable=g-import-not-at-top
  workdir = str(tmp_path_factory.mktemp('topk_six_steps'))
  summary = trainer.train_and_evaluate(helpers.small_config('router=topk', **helpers.SIX_STEPS),
                                       workdir, devices=jax.devices()[:1])
  return workdir, summary
