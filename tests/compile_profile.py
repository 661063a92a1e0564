"""Opt-in pytest plugin: each test's wall time and XLA compile time, one JSON line each.

Most of this suite's time is XLA compilation (56% of the summed in-process test
time in one measured run), so `--durations` alone does not say what to cut. Run

    PROFILE_OUT=/tmp/tests.jsonl bash scripts/test.sh -p tests.compile_profile

and each test appends {test, wall, cpu, child_cpu, compile, ncompile, trace,
lower, pid}: seconds of wall and process CPU time, the CPU time of the
subprocesses it started and waited for, seconds spent in XLA's backend
compilation (JAX's "/jax/core/compile/backend_compile_duration" events), the
number of programs compiled, and seconds spent tracing jaxprs and lowering
them to MLIR. Compiles in subprocesses are not counted (they are in child_cpu).
`python -m tests.compile_profile FILE` sums them per file.

Without -n (one process), the terminal summary also lists the programs that
took the most compile time, by name: `jit(where)`, `jit(broadcast_in_dim)` and
the like are single operations run eagerly, each compiled per shape (calling
the function under test through `jax.jit` compiles it once instead).
"""
import collections
import contextlib
import json
import os
import resource
import sys
import time

import pytest

# JAX reports each XLA compilation under this event name (tests count compiles by it).
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# Tracing to a jaxpr and lowering it to MLIR, the steps before each compilation.
_TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
_LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
_totals = {"seconds": 0.0, "count": 0, "trace": 0.0, "lower": 0.0}
_by_program = collections.defaultdict(lambda: [0, 0.0])  # name: [compiles, seconds]


@contextlib.contextmanager
def counting_compiles(into: list):
  """Appends one entry (its seconds) per XLA compilation in the block to `into`."""
  from jax import monitoring  # pylint: disable=g-import-not-at-top

  def listener(event, duration, **kwargs):
    del kwargs
    if event == COMPILE_EVENT:
      into.append(duration)

  monitoring.register_event_duration_secs_listener(listener)
  try:
    yield
  finally:
    monitoring.unregister_event_duration_listener(listener)


def _listener(event, duration, **kwargs):
  if event == COMPILE_EVENT:
    _totals["seconds"] += duration
    _totals["count"] += 1
    program = _by_program[kwargs.get("fun_name", "?")]
    program[0] += 1
    program[1] += duration
  elif event == _TRACE_EVENT:
    _totals["trace"] += duration
  elif event == _LOWER_EVENT:
    _totals["lower"] += duration


def pytest_configure(config):
  del config
  from jax import monitoring
  monitoring.register_event_duration_secs_listener(_listener)


def pytest_terminal_summary(terminalreporter):
  if not _by_program:  # Under -n the workers compiled; their names stay there.
    return
  terminalreporter.section("programs compiled (most compile time first)")
  for name, (count, seconds) in sorted(_by_program.items(), key=lambda kv: -kv[1][1])[:25]:
    terminalreporter.write_line(f"{seconds:8.2f} s {count:5d}x  {name[:100]}")


def _children_cpu():
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  before = dict(_totals)
  wall, cpu, child_cpu = time.time(), time.process_time(), _children_cpu()
  yield
  record = {"test": item.nodeid, "wall": time.time() - wall, "cpu": time.process_time() - cpu,
            "child_cpu": _children_cpu() - child_cpu,
            "compile": _totals["seconds"] - before["seconds"],
            "ncompile": _totals["count"] - before["count"],
            "trace": _totals["trace"] - before["trace"], "lower": _totals["lower"] - before["lower"],
            "pid": os.getpid()}
  with open(os.environ.get("PROFILE_OUT", "compile_profile.jsonl"), "a") as f:
    f.write(json.dumps(record) + "\n")


def per_file(path: str):
  """[(file, wall, cpu + child_cpu, compile, programs, tests)], the longest first."""
  sums = collections.defaultdict(lambda: [0.0, 0.0, 0.0, 0, 0])
  with open(path) as f:
    for line in f:
      record = json.loads(line)
      total = sums[record["test"].split("::")[0]]
      total[0] += record["wall"]
      total[1] += record["cpu"] + record.get("child_cpu", 0.0)
      total[2] += record["compile"]
      total[3] += record["ncompile"]
      total[4] += 1
  return sorted(((name, *v) for name, v in sums.items()), key=lambda row: -row[1])


if __name__ == "__main__":
  for name, wall, cpu, compiled, programs, tests in per_file(sys.argv[1]):
    print(f"{wall:8.1f} s wall {cpu:8.1f} s CPU {compiled:8.1f} s compiling "
          f"{programs:5d} programs {tests:4d} tests  {name}")
