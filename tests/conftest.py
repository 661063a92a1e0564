"""Session-wide test setup.

Eight fake CPU devices let sharding tests run in-process; the flag must be set
before JAX is first imported, which is why it lives here. Unsharded computations
still run on device 0, so other tests are unaffected.
"""
import os

from tests.xla_flags import xla_flags

os.environ.setdefault("XLA_FLAGS", xla_flags(8))
os.environ.setdefault("POT_BACKEND_DISABLE_TENSORFLOW", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
