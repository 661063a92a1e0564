"""Evaluation: few-shot linear transfer of frozen pre-logit features.

`fewshot` (protocol, evaluator, periodic action), `ridge` (closed-form ridge and
L2 selection), `features` (sharded feature extraction), `config` (defaults).
"""
from vmoe_sparse_ot.evaluate import config, features, fewshot, ridge
