"""`--threads N` for the benchmark scripts: XLA's CPU intra-op threads.

Must run before JAX starts (XLA reads XLA_FLAGS once), so the scripts call
`from_argv()` before importing jax; argparse then accepts the flag as usual.
"""
import os
import sys


def from_argv(argv=None) -> None:
  """Appends the XLA flags for `--threads N` in argv (sys.argv) to XLA_FLAGS.

  N = 1 also turns Eigen's thread pool off: one thread, runs reproducible to
  about 1% when the process is pinned to one core (`taskset -c 0`).
  """
  argv = sys.argv if argv is None else argv
  if "--threads" not in argv:
    return
  n = argv[argv.index("--threads") + 1]
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_cpu_multi_thread_eigen={'false' if n == '1' else 'true'}"
                             f" intra_op_parallelism_threads={n}")
