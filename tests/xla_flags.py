"""XLA flags of every test process: the pytest workers and the subprocesses tests start.

Tests compile far more than they run. LLVM at -O1 instead of XLA's default -O2
compiles the tiny config's train step in 8.1 s of CPU instead of 12.6 s and runs
it as fast (20 steps: 0.22 s against 0.24 s), measured on this project's 2-core
machine.

XLA:CPU's older fusion emitters (--xla_cpu_use_fusion_emitters=false) compile
the OT solver's program in half the CPU time of the MLIR fusion emitters (30 x
8 sparsity-constrained L-BFGS: 1.9 s against 3.7 s) and a tiny ViT's test file
in 18% less; both emitters are XLA's own, the choice a supported flag.
"""
FAST_COMPILE = '--xla_backend_optimization_level=1 --xla_cpu_use_fusion_emitters=false'


def xla_flags(num_devices: int) -> str:
  """XLA_FLAGS for a process with `num_devices` fake CPU devices."""
  return f'--xla_force_host_platform_device_count={num_devices} {FAST_COMPILE}'
