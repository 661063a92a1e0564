"""Trained runs shared by several trainer test files.

Session scope: once per pytest-xdist worker that needs one.

The tests use no persistent XLA compilation cache. With one shared by the
pytest-xdist workers and their subprocesses, workers died in two CI runs and
one full run here, each time in another test; the one stack that was kept
shows the abort inside XLA:CPU's `deserialize_executable`, reading a cache
entry (JAX 0.10.2).
"""
import jax
import pytest


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
