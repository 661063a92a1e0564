"""The config of every job: `from vmoe_sparse_ot import config as config_lib`.

The pieces live in their own modules:
- `schema`: `base_config()`, every key the trainer reads, with defaults;
- `fewshot_section`: the few-shot section's defaults and transfer datasets;
- `files`: `load_config_file('path.py[:k=v]')`, `parse_arg`, `flatten`,
  `pp_template` (pp strings that follow `image_size`);
- `validation`: `validate(config)` (types, ranges, divisibility; one line
  naming the key), `validate_for_devices`, `ConfigError`: pure value checks;
- `preflight`: the checks that read the disk, the datasets or the weights, or
  trace the model: `check_directory`, `make_directory`, `check_datasets`, `check_initialization`,
  `check_before_training` (all of them, after `validate` and the model's options);
- `pp_targets`: what a pp string's output must hold for the loss and mixup;
- `cli`: one-line command-line errors, `explain_override`, `format_config`;
- `paper`: the paper's V-MoE B/32 and B/16 recipe.
Unknown keys in any section are reported by `vmoe_sparse_ot.config_keys.check_keys`.
"""
from vmoe_sparse_ot.config_keys import check_keys
from vmoe_sparse_ot.config.cli import explain_override
from vmoe_sparse_ot.config.cli import format_config
from vmoe_sparse_ot.config.files import flatten
from vmoe_sparse_ot.config.files import load_config_file
from vmoe_sparse_ot.config.files import parse_arg
from vmoe_sparse_ot.config.files import pp_template
from vmoe_sparse_ot.config.schema import AUGMENTATIONS
from vmoe_sparse_ot.config.schema import MESH_AXES
from vmoe_sparse_ot.config.schema import OPTIMIZERS
from vmoe_sparse_ot.config.schema import SAMPLINGS
from vmoe_sparse_ot.config.schema import SCHEDULES
from vmoe_sparse_ot.config.schema import base_config
from vmoe_sparse_ot.config.schema import schedule_record
from vmoe_sparse_ot.config.preflight import check_before_training
from vmoe_sparse_ot.config.preflight import check_datasets
from vmoe_sparse_ot.config.preflight import check_directory
from vmoe_sparse_ot.config.preflight import make_directory
from vmoe_sparse_ot.config.validation import ConfigError
from vmoe_sparse_ot.config.validation import validate
from vmoe_sparse_ot.config.validation import validate_for_devices
from vmoe_sparse_ot.config.paper import PAPER_BATCH_SIZE
from vmoe_sparse_ot.config.paper import PAPER_DATASETS
from vmoe_sparse_ot.config.paper import PAPER_TRAIN_STEPS
from vmoe_sparse_ot.config.paper import paper_vmoe_config

__all__ = [
    'AUGMENTATIONS', 'ConfigError', 'MESH_AXES', 'OPTIMIZERS', 'PAPER_BATCH_SIZE',
    'PAPER_DATASETS', 'PAPER_TRAIN_STEPS', 'SAMPLINGS', 'SCHEDULES', 'base_config',
    'check_before_training', 'check_datasets', 'check_directory', 'check_keys',
    'explain_override', 'flatten', 'format_config', 'load_config_file', 'make_directory',
    'paper_vmoe_config', 'parse_arg', 'pp_template', 'schedule_record', 'validate', 'validate_for_devices',
]
