"""Model config records: keys added later are left out at their defaults."""
import pytest

from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot import errors
from vmoe_sparse_ot.nn import model_config


def test_keys_added_later_are_not_recorded_at_their_defaults_so_older_workdirs_resume():
  config = model_config.default_model_config().to_dict()
  record = model_config.without_compute_keys(config, only_defaults=True)
  assert 'dropout_rate' not in record['encoder']['moe']
  assert not {'capacity_ceil_or_round', 'capacity_multiple_of'} & set(
      record['encoder']['moe']['router'])
  assert 'dropout_rate' in config['encoder']['moe']          # the input is not changed
  # A record from before these keys existed matches today's defaults...
  checkpoints.check_compatible({'model_config': record}, record, {}, 'W')
  # ...and set to another value they are recorded, and compared.
  config['encoder']['moe']['router']['capacity_ceil_or_round'] = 'round'
  changed = model_config.without_compute_keys(config, only_defaults=True)
  assert changed['encoder']['moe']['router']['capacity_ceil_or_round'] == 'round'
  with pytest.raises(errors.ResumeMismatchError,
                     match=r"model.encoder.moe.router.capacity_ceil_or_round: checkpoint "
                     r"'<absent>', config 'round'"):
    checkpoints.check_compatible({'model_config': record}, changed, {}, 'W')


def test_sparse_ot_implementation_is_not_compared_so_workdirs_from_before_auto_resume():
  """Records from before implementation='auto' hold the default of then, 'fast';
  the key chooses how the plans are computed (the same plans up to rounding), so
  a checkpoint resumes and is evaluated under any value of it."""
  from vmoe_sparse_ot.evaluate import checkpoint_config  # pylint: disable=g-import-not-at-top
  config = model_config.default_model_config()
  assert config.encoder.moe.router.sparse_ot.implementation == 'auto'
  now = model_config.without_compute_keys(config.to_dict(), only_defaults=True)
  assert now['encoder']['moe']['router']['sparse_ot']['implementation'] == 'auto'  # recorded
  old = model_config.without_compute_keys(config.to_dict(), only_defaults=True)
  old['encoder']['moe']['router']['sparse_ot']['implementation'] = 'fast'
  checkpoints.check_compatible({'model_config': old}, now, {}, 'W')
  assert checkpoint_config.model_config_differences(old, config) == []
  config.encoder.moe.router.sparse_ot.gamma = 2.0       # the other options still are
  with pytest.raises(errors.ResumeMismatchError, match=r'sparse_ot.gamma: checkpoint 1.0'):
    checkpoints.check_compatible(
        {'model_config': old},
        model_config.without_compute_keys(config.to_dict(), only_defaults=True), {}, 'W')
