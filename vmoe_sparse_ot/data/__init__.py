"""Input pipelines (TFDS + tf.data) and embedded offline datasets.

Public API (docs/ARCHITECTURE.md): `make_dataset`, `num_classes`; also
`num_examples`, `check_dataset` (exists, with these splits?), `check_pp` (does a
pp string give the model's input?), `trace_pp` (its output entries), `image_shape`
(of the stored images), `declared_image_shape` (the same, without the data), `to_global`
(per-process batch -> global jax.Array), `get_builder` and `default_data_dir`.

Attributes load on first use (PEP 562), so `python -m vmoe_sparse_ot.data --help`
answers without importing TensorFlow; TensorFlow's start-up logging variables are
set here, before anything in the package imports it.
"""
import importlib

from vmoe_sparse_ot import quiet_logs

quiet_logs.setup_environment()

_ATTRIBUTES = {
    'default_data_dir': 'vmoe_sparse_ot.data.embedded',
    'check_dataset': 'vmoe_sparse_ot.data.pipeline',
    'check_pp': 'vmoe_sparse_ot.data.pipeline',
    'declared_image_shape': 'vmoe_sparse_ot.data.pipeline',
    'get_builder': 'vmoe_sparse_ot.data.pipeline',
    'image_shape': 'vmoe_sparse_ot.data.pipeline',
    'label_shape': 'vmoe_sparse_ot.data.pipeline',
    'make_dataset': 'vmoe_sparse_ot.data.pipeline',
    'num_classes': 'vmoe_sparse_ot.data.pipeline',
    'num_examples': 'vmoe_sparse_ot.data.pipeline',
    'to_global': 'vmoe_sparse_ot.data.pipeline',
    'trace_pp': 'vmoe_sparse_ot.data.pipeline',
}
__all__ = sorted(_ATTRIBUTES)


def __getattr__(name):
  if name in _ATTRIBUTES:
    return getattr(importlib.import_module(_ATTRIBUTES[name]), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def __dir__():
  return sorted(list(globals()) + __all__)
