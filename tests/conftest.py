"""Session-wide test setup.

Eight fake CPU devices let sharding tests run in-process; the flag must be set
before JAX is first imported, which is why it lives here. Unsharded computations
still run on device 0, so other tests are unaffected.
"""
import gc
import os

import pytest

from tests.crash_recovery import pytest_xdist_make_scheduler  # noqa: F401  (a hook)
from tests.xla_flags import xla_flags

os.environ.setdefault("XLA_FLAGS", xla_flags(8))
# Tracing and lowering JAX programs makes millions of short-lived Python objects,
# and at CPython's default thresholds (700, 10, 10) the cyclic collector ran 1996
# times in tests/nn/test_vit.py + tests/ot/test_selection.py (3.8 s of collection);
# at (10000, 20, 10), 106 times (1.5 s), with the same peak memory (1.0 GB). The
# test processes only: the library and its commands leave the collector alone.
gc.set_threshold(10000, 20, 10)
# No Python traceback in each lowered op's location (JAX keeps 10 frames by
# default, for profiles and debug dumps): the OT selection and projection
# files lowered and compiled in 10% less time without them. Inherited by the
# subprocesses tests start.
os.environ.setdefault("JAX_TRACEBACK_IN_LOCATIONS_LIMIT", "0")
os.environ.setdefault("POT_BACKEND_DISABLE_TENSORFLOW", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


# Test files, slowest first: per-file sums of each test's setup, call and
# teardown wall time (`--durations=0`, one whole run from a fresh clone on 2
# cores, 2026-11-28, after this stop's cuts); files under 4 s are left to the
# collection order.
# scripts/test.sh hands
# files to the two workers in this order (--dist loadfile
# --no-loadscope-reorder), so the long files start first and the short ones fill
# the gaps at the end, instead of one worker finishing a long file alone. Files
# not listed follow in collection order.
SLOWEST_FIRST = (
    "tests/ot/test_newton.py",
    "tests/test_docs.py",
    "tests/train/test_multiprocess.py",
    "tests/experiments/test_upcycle_finetune.py",
    "tests/ot/test_selection.py",
    "tests/train/test_routers.py",
    "tests/test_cli.py",
    "tests/ot/test_solvers.py",
    "tests/nn/test_vit.py",
    "tests/train/test_trainer.py",
    "tests/train/test_reliability.py",
    "tests/ot/test_float32.py",
    "tests/train/test_resume.py",
    "tests/experiments/test_mnist_clustering.py",
    "tests/evaluate/test_job.py",
    "tests/ot/test_precision.py",
    "tests/experiments/test_router_study.py",
    "tests/test_fewshot.py",
    "tests/ot/test_interior_point.py",
    "tests/train/test_recipes.py",
    "tests/train/test_initialization.py",
    "tests/config/test_reference_data.py",
    "tests/ot/test_differentiation.py",
    "tests/nn/routers/test_sparse_ot.py",
    "tests/ot/test_start.py",
    "tests/test_quickstart.py",
    "tests/ot/test_duality.py",
    "tests/ot/test_numerics.py",
    "tests/train/test_mixup.py",
    "tests/nn/test_sharding.py",
    "tests/config/test_reference.py",
    "tests/ot/test_batched.py",
    "tests/train/test_memory_levers.py",
    "tests/ot/test_projections.py",
    "tests/ot/test_feasibility.py",
    "tests/ot/test_trace.py",
    "tests/test_plot.py",
    "tests/train/test_profiling.py",
    "tests/train/test_eval_datasets.py",
    "tests/evaluate/test_inference.py",
    "tests/data/test_pipeline.py",
    "tests/ot/test_candidates.py",
    "tests/train/test_microsteps.py",
    "tests/train/test_failures.py",
    "tests/checkpoints/test_read.py",
    "tests/experiments/test_k_convergence.py",
    "tests/nn/test_moe.py",
    "tests/train/test_optimizer.py",
    "tests/initialization/test_models.py",
    "tests/experiments/test_formulations_2d.py",
    "tests/evaluate/test_transfer.py",
    "tests/evaluate/test_features.py",
    "tests/ot/test_objectives.py",
    "tests/nn/test_ensemble.py",
    "tests/test_layers.py",
    "tests/experiments/test_gaussians_1d.py",
    "tests/experiments/test_solver_comparison.py",
    "tests/experiments/test_supply_demand.py",
    "tests/experiments/test_color_transfer.py",
    "tests/train/test_model_state.py",
    "tests/experiments/test_smoothness_vs_k.py",
    # After the experiment files: `all --resume` reuses the quick runs they made.
    "tests/experiments/test_all.py",
)


def pytest_collection_modifyitems(config, items):
  del config
  rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
  # Stable: each file keeps its own order of tests.
  items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(autouse=True)
def _absl_logger_level_restored():
  """Each test leaves absl's logger level as it found it.

  Tests that run a command's main in-process reset absl's flags afterwards, and
  the reset sets the logger to --verbosity's default (WARNING): a later test in
  the same worker would then capture no INFO records (caplog).
  """
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
  logger = absl_logging.get_absl_logger()
  level = logger.level
  yield
  logger.setLevel(level)
