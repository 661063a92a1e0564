"""quiet_logs: TensorFlow's start-up variables, and the filter on library chatter."""
import logging
import os

from absl import logging as absl_logging

from vmoe_sparse_ot import quiet_logs


def test_setup_environment_sets_tensorflow_variables_unless_the_user_did(monkeypatch):
  monkeypatch.delenv('TF_CPP_MIN_LOG_LEVEL', raising=False)
  monkeypatch.setenv('TF_ENABLE_ONEDNN_OPTS', '1')
  quiet_logs.setup_environment()
  assert os.environ['TF_CPP_MIN_LOG_LEVEL'] == '2'
  assert os.environ['TF_ENABLE_ONEDNN_OPTS'] == '1'


def _record(level, pathname, message):
  return logging.LogRecord('absl', level, pathname, 1, message, None, None)


def test_library_info_lines_and_known_noise_are_dropped_the_rest_kept():
  keep = quiet_logs._QuietLibraries().filter  # pylint: disable=protected-access
  lib = '/site-packages/orbax/checkpoint/manager.py'
  assert not keep(_record(logging.INFO, lib, 'Saving item'))
  assert keep(_record(logging.WARNING, lib, 'Disk almost full'))
  assert keep(_record(logging.INFO, '/vmoe_sparse_ot/train/trainer.py', 'step 10'))
  assert not keep(_record(logging.WARNING, '/jax/_src/xla_bridge.py',
                          "Unable to initialize backend 'tpu': not found"))
  assert not keep(_record(logging.ERROR, '/x.py', 'Variant folder /d/1.0.0 has no '
                          'dataset_info.json'))
  assert keep(_record(logging.INFO, '/tensorflow/x.py', 'TensorFlow, not a chatty library'))


def test_quiet_library_logs_installs_one_filter_on_each_logger():
  loggers = [logging.getLogger(name) for name in ('absl', 'jax._src.xla_bridge', '')]
  targets = loggers + [absl_logging.get_absl_handler()]
  before = [list(t.filters) for t in targets]
  try:
    quiet_logs.quiet_library_logs()
    quiet_logs.quiet_library_logs()
    for target in targets:
      assert target.filters.count(quiet_logs._FILTER) == 1  # pylint: disable=protected-access
  finally:
    for target, filters in zip(targets, before):
      target.filters[:] = filters
