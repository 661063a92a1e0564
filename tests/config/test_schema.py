"""config.schema: its constants match the code they mirror."""
from vmoe_sparse_ot import config as config_lib


def test_one_key_checker_and_schema_constants_match_the_code_they_mirror():
  from vmoe_sparse_ot import config_keys  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.data import pipeline  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.data import __main__ as data_cli  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot.data import embedded  # pylint: disable=g-import-not-at-top
  assert config_lib.check_keys is config_keys.check_keys
  assert config_lib.AUGMENTATIONS == pipeline.AUGMENTATIONS
  assert config_lib.SAMPLINGS == pipeline.SAMPLINGS
  assert tuple(sorted(embedded.BUILDERS)) == data_cli.NAMES
