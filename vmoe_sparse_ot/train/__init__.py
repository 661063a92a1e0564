"""Training: config helpers, optimizer/schedules, partitioning, checkpoints, trainer.

Submodules are imported on use (`from vmoe_sparse_ot.train import checkpoints`) so
that reading a checkpoint does not pull in TensorFlow or the model.
"""
