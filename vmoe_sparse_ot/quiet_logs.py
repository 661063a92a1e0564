"""Keeps the command-line jobs' logs readable.

Orbax logs dozens of INFO lines per save or restore and TFDS a few per dataset
opened; the jobs' own INFO lines (progress, evaluation) and every library's
warnings stay.
"""
import logging as std_logging

from absl import logging

_CHATTY_LIBRARIES = ('/orbax/', '/tensorflow_datasets/')


class _QuietLibraries(std_logging.Filter):
  """Drops INFO records emitted from inside the chatty libraries."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    if record.levelno >= std_logging.WARNING:
      return True
    return not any(lib in record.pathname for lib in _CHATTY_LIBRARIES)


def quiet_library_logs() -> None:
  """Installs the filter on absl's handler (call once, at the start of main)."""
  logging.get_absl_handler().addFilter(_QuietLibraries())
