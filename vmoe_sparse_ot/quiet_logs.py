"""Keeps the command-line jobs' console readable.

Two parts, both called by every entry point (main, fewshot, data, plot):
- `setup_environment()`, before TensorFlow or JAX is imported: TensorFlow's C++
  start-up lines (oneDNN notice, CPU feature guard) are switched off with
  environment variables; `TF_CPP_MIN_LOG_LEVEL` alone does not stop the oneDNN one.
- `quiet_library_logs()`, once logging is set up: drops the libraries' routine
  chatter — Orbax's, TFDS's and TensorBoard's (its event reader) INFO lines,
  JAX's probe for a TPU on a machine without one, Orbax's notes that a
  restore-only checkpoint manager is read-only, and TFDS's notes while it writes
  an embedded dataset. Every other warning and
  the jobs' own lines stay.
"""
import logging as std_logging
import os
import re

_CHATTY_LIBRARIES = ('/orbax/', '/tensorflow_datasets/', '/tensorboard/')
# (logger-independent) messages that say nothing to a user of these jobs.
_NOISE = (
    # jax: probing backends that are not installed (e.g. libtpu on a CPU machine).
    re.compile(r"Unable to initialize backend '(tpu|cuda|rocm)'"),
    # orbax: restore-only managers (few-shot, plots) are read-only on purpose.
    re.compile(r'read_only=True, setting save_interval_steps'),
    re.compile(r'Given directory is read only'),
    # tfds: a dataset being written has no dataset_info.json yet.
    re.compile(r'Variant folder .* has no '),
)


def setup_environment() -> None:
  """Sets TensorFlow's logging variables; call before TensorFlow is imported."""
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  os.environ.setdefault('TF_ENABLE_ONEDNN_OPTS', '0')


class _QuietLibraries(std_logging.Filter):
  """Drops library INFO records and the known-noise messages at any level."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    try:
      message = record.getMessage()
    except Exception:  # pylint: disable=broad-except
      return True
    if any(p.search(message) for p in _NOISE):
      return False
    if record.levelno >= std_logging.WARNING:
      return True
    return not any(lib in record.pathname for lib in _CHATTY_LIBRARIES)


_FILTER = _QuietLibraries()
# Loggers whose records reach the console: absl's (TFDS, Orbax, the jobs) and
# JAX's backend probe, which logs through the standard library directly.
_LOGGERS = ('absl', 'jax._src.xla_bridge', '')


def quiet_library_logs() -> None:
  """Installs the filter on the loggers and absl's handler (idempotent)."""
  from absl import logging  # pylint: disable=g-import-not-at-top
  for name in _LOGGERS:
    logger = std_logging.getLogger(name)
    if _FILTER not in logger.filters:
      logger.addFilter(_FILTER)
  handler = logging.get_absl_handler()
  if _FILTER not in handler.filters:
    handler.addFilter(_FILTER)
