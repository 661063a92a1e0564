"""XLA flags of every test process: the pytest workers and the subprocesses tests start.

Tests compile far more than they run, so they compile with LLVM at -O0
(XLA's default is -O2). On this project's 2-core machine the tiny config's
train step compiles in 1.6-2.0 s instead of 4.7-5.1 s at -O1, and the whole
suite's pytest time fell from 1123 s (-O1) to 713 s; the longer run times of
unoptimized code (the radix selection test: 9 s -> 19 s) are far smaller.

-fast-isel=false: at -O0 LLVM selects instructions of simple functions with
FastISel and of the others with SelectionDAG, and only SelectionDAG fuses a
multiply and an add into one FMA. Two XLA fusions that both recompute
1 - softmax(logits) then rounded differently: the selection passes
(`ot.selection`) compare entries with a maximum found in another fusion, none
matched, and a router's selected positions came out of range. With
SelectionDAG everywhere (as at -O1 and above) the copies round alike.

XLA:CPU's older fusion emitters (--xla_cpu_use_fusion_emitters=false) compile
the OT solver's program in half the CPU time of the MLIR fusion emitters (30 x
8 sparsity-constrained L-BFGS at -O1: 1.9 s against 3.7 s); both emitters are
XLA's own, the choice a supported flag.

--xla_cpu_parallel_codegen_split_count=1: XLA:CPU splits each program's LLVM
module to compile the parts on several threads. The two test workers already
keep both cores busy, so the split only adds work: tests/ot/test_selection.py,
test_optimizer.py and test_losses.py took 58-62 s of CPU with one part against
64-68 s with the default split (the same wall time run alone).
"""
FAST_COMPILE = ('--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false '
                '--xla_backend_extra_options=-fast-isel=false '
                '--xla_cpu_parallel_codegen_split_count=1')


def xla_flags(num_devices: int) -> str:
  """XLA_FLAGS for a process with `num_devices` fake CPU devices."""
  return f'--xla_force_host_platform_device_count={num_devices} {FAST_COMPILE}'
