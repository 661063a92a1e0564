"""Loading the repository's config files by name, as the config tests do."""
from vmoe_sparse_ot import config as config_lib
from tests.train.helpers import ROOT


def load(name, arg=None):
  """configs/`name` loaded with its `arg` ('key=value,...'), as `--config=` would."""
  path = str(ROOT / 'configs' / name)
  return config_lib.load_config_file(f'{path}:{arg}' if arg else path)
