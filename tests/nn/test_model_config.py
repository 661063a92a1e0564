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


def test_sparse_ot_records_from_before_newton_resume_with_solver_adam_and_not_without():
  """A record from before solver='newton' became the default holds solver 'adam',
  num_steps 50 and no tol. With solver='adam' set (num_steps None: the solver's 50)
  it resumes and evaluates as it was; under the new default it is refused in one
  line naming the key (the routing would change)."""
  from vmoe_sparse_ot.evaluate import checkpoint_config  # pylint: disable=g-import-not-at-top
  config = model_config.default_model_config()
  sparse = config.encoder.moe.router.sparse_ot
  assert (sparse.solver, sparse.num_steps, sparse.tol) == ('newton', None, 1e-6)
  old = model_config.without_compute_keys(config.to_dict(), only_defaults=True)
  old['encoder']['moe']['router']['sparse_ot'].update(solver='adam', num_steps=50)
  assert 'tol' not in old['encoder']['moe']['router']['sparse_ot']   # at its default: left out
  with pytest.raises(errors.ResumeMismatchError, match=r'sparse_ot.solver: checkpoint'):
    checkpoints.check_compatible(
        {'model_config': old},
        model_config.without_compute_keys(config.to_dict(), only_defaults=True), {}, 'W')
  sparse.solver = 'adam'
  now = model_config.without_compute_keys(config.to_dict(), only_defaults=True)
  checkpoints.check_compatible({'model_config': old}, now, {}, 'W')
  assert checkpoint_config.model_config_differences(old, config) == []
