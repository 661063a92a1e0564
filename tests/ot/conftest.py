"""Fixtures for the OT tests: float64 by default (the paper's checks are tight)."""
import jax
import pytest


@pytest.fixture(autouse=True)
def x64(request):
  """Runs each test with jax_enable_x64 unless it is marked `float32`."""
  if request.node.get_closest_marker("float32"):
    yield
    return
  with jax.enable_x64(True):
    yield


def pytest_configure(config):
  config.addinivalue_line("markers", "float32: run the test without jax_enable_x64")
