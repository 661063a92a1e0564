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
