"""Checkpoints of a training run under `WORKDIR/checkpoints`, for every job.

Each step folder holds three items (four with router state):
- 'params': the model parameters (sharded arrays, written by every process), on
  their own so that the few-shot job reads them without the optimizer;
- 'state': the rest of the training state: {'opt_state', 'rng', 'step'};
- 'model_state' (only for a model with router state, e.g. topk_bias): the
  state's `model_state`, {'router_state': per-layer state}, so that readers of the
  params route as the trainer does; a run without state writes no such item;
- 'meta': JSON, the run record (`train.run_record`) and the step, so that a
  workdir whose checkpoint does not fit the config is refused with the
  differences named, before any array is read.

Modules: `layout` (the folders on disk), `store` (the Orbax store: async atomic
saves, resume past damaged steps), `read` (the read-only API of the other jobs),
`orbax_quirks` (logging and asyncio workarounds).
Stores pytrees and their metadata; knows nothing of the trainer.
"""
from vmoe_sparse_ot.checkpoints.layout import CORRUPT_SUFFIX
from vmoe_sparse_ot.checkpoints.layout import DIVERGED_SUFFIX
from vmoe_sparse_ot.checkpoints.layout import ITEMS
from vmoe_sparse_ot.checkpoints.layout import TMP_PATTERN
from vmoe_sparse_ot.checkpoints.layout import checkpoint_dir
from vmoe_sparse_ot.checkpoints.layout import move_aside
from vmoe_sparse_ot.checkpoints.layout import remove_unfinished_saves
from vmoe_sparse_ot.checkpoints.orbax_quirks import MIN_REPLICA_SLICE_BYTES
from vmoe_sparse_ot.checkpoints.read import param_shapes
from vmoe_sparse_ot.checkpoints.read import read_meta
from vmoe_sparse_ot.checkpoints.read import restore_model_state
from vmoe_sparse_ot.checkpoints.read import restore_params
from vmoe_sparse_ot.checkpoints.read import restore_params_with_meta
from vmoe_sparse_ot.checkpoints.store import Checkpointer
from vmoe_sparse_ot.checkpoints.store import is_disk_full

__all__ = [
    'CORRUPT_SUFFIX', 'Checkpointer', 'DIVERGED_SUFFIX', 'ITEMS', 'MIN_REPLICA_SLICE_BYTES', 'TMP_PATTERN',
    'checkpoint_dir', 'is_disk_full', 'move_aside',
    'param_shapes', 'read_meta', 'remove_unfinished_saves', 'restore_model_state',
    'restore_params', 'restore_params_with_meta',
]
