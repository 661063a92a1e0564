"""Evaluation: few-shot linear transfer of frozen pre-logit features.

`transfer` (the few-shot protocol, evaluator, periodic action), `ridge`
(closed-form ridge and L2 selection), `features` (sharded feature extraction);
the config section is `config.fewshot_section`; `checkpoint_fewshot`, the few-shot
job of a saved checkpoint without flags. Standalone checkpoint evaluation: `job`
(`python -m vmoe_sparse_ot.evaluate`), `overrides` (eval-time routing overrides,
shared with `vmoe_sparse_ot.load`).
"""
from vmoe_sparse_ot import quiet_logs

# Before JAX or TensorFlow first log (`python -m vmoe_sparse_ot.evaluate` runs this first).
quiet_logs.setup_environment()

from vmoe_sparse_ot.evaluate import features, ridge, transfer  # noqa: E402,F401
