"""XLA flags of every test process: the pytest workers and the subprocesses tests start.

Tests compile far more than they run (measured with JAX's compile-time events:
backend compilation was 56% of the suite's in-process test time). LLVM at -O0
without its expensive passes compiles the OT solver's program (L-BFGS, 30 x
10) in 2.4 s of CPU instead of 4.3 s at -O1 (12.6 s at XLA's default -O2 for
the tiny config's train step), and the test files run faster as a whole
despite slower compiled code: tests/ot/test_selection.py 116 s against 150 s,
tests/train/test_trainer.py 151 s against 198 s (side by side, one core each,
this project's 2-core machine).
"""
FAST_COMPILE = '--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true'


def xla_flags(num_devices: int) -> str:
  """XLA_FLAGS for a process with `num_devices` fake CPU devices."""
  return f'--xla_force_host_platform_device_count={num_devices} {FAST_COMPILE}'
