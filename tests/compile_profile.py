"""Opt-in pytest plugin: each test's wall time and XLA compile time, one JSON line each.

Most of this suite's time is XLA compilation (56% of the summed in-process test
time in one measured run), so `--durations` alone does not say what to cut. Run

    PROFILE_OUT=/tmp/tests.jsonl bash scripts/test.sh -p tests.compile_profile

and each test appends {test, wall, cpu, compile, ncompile, pid}: seconds of
wall and process CPU time, seconds spent in XLA's backend compilation
(JAX's "/jax/core/compile/backend_compile_duration" events) and the number of
programs compiled. Compiles in subprocesses a test starts are not counted (they
show as wall time). `python -m tests.compile_profile FILE` sums them per file.
"""
import collections
import contextlib
import json
import os
import sys
import time

import pytest

# JAX reports each XLA compilation under this event name (tests count compiles by it).
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_totals = {"seconds": 0.0, "count": 0}


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
  del kwargs
  if event == COMPILE_EVENT:
    _totals["seconds"] += duration
    _totals["count"] += 1


def pytest_configure(config):
  del config
  from jax import monitoring
  monitoring.register_event_duration_secs_listener(_listener)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
  del nextitem
  seconds, count = _totals["seconds"], _totals["count"]
  wall, cpu = time.time(), time.process_time()
  yield
  record = {"test": item.nodeid, "wall": time.time() - wall, "cpu": time.process_time() - cpu,
            "compile": _totals["seconds"] - seconds, "ncompile": _totals["count"] - count,
            "pid": os.getpid()}
  with open(os.environ.get("PROFILE_OUT", "compile_profile.jsonl"), "a") as f:
    f.write(json.dumps(record) + "\n")


def per_file(path: str):
  """[(file, wall, compile, programs, tests)], the longest first."""
  sums = collections.defaultdict(lambda: [0.0, 0.0, 0, 0])
  with open(path) as f:
    for line in f:
      record = json.loads(line)
      total = sums[record["test"].split("::")[0]]
      total[0] += record["wall"]
      total[1] += record["compile"]
      total[2] += record["ncompile"]
      total[3] += 1
  return sorted(((name, *v) for name, v in sums.items()), key=lambda row: -row[1])


if __name__ == "__main__":
  for name, wall, compiled, programs, tests in per_file(sys.argv[1]):
    print(f"{wall:8.1f} s wall {compiled:8.1f} s compiling {programs:5d} programs "
          f"{tests:4d} tests  {name}")
