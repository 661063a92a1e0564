"""Input pipelines (TFDS + tf.data) and embedded offline datasets.

Public API (docs/ARCHITECTURE.md): `make_dataset`, `num_classes`; also
`num_examples`, `to_global` (per-process batch -> global jax.Array) and
`default_data_dir`.
"""
from vmoe_sparse_ot.data.embedded import default_data_dir
from vmoe_sparse_ot.data.pipeline import get_builder
from vmoe_sparse_ot.data.pipeline import make_dataset
from vmoe_sparse_ot.data.pipeline import num_classes
from vmoe_sparse_ot.data.pipeline import num_examples
from vmoe_sparse_ot.data.pipeline import to_global

__all__ = ['default_data_dir', 'get_builder', 'make_dataset', 'num_classes',
           'num_examples', 'to_global']
