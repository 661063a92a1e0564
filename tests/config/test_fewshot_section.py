"""config.fewshot defaults, the paper's transfer sets, and validation."""
import pytest

from vmoe_sparse_ot.config import fewshot_section as fewshot_config
from vmoe_sparse_ot.evaluate import transfer


def test_defaults():
  cfg = transfer.default_fewshot_config()
  fewshot_config.validate(cfg)
  assert cfg.shots == (1, 5, 10, 25)
  assert cfg.l2_regs[0] == 2.0**-10 and cfg.l2_regs[-1] == 2.0**19 and len(cfg.l2_regs) == 30
  assert cfg.every_steps == 0 and cfg.l2_selection == 'loo'
  assert {k: v.name for k, v in cfg.datasets.items()} == {
      'digits': 'sklearn_digits', 'mnist': 'embedded_mnist'}
  assert cfg.datasets.mnist.test_split == 'test'


def test_transfer_datasets_names_paper_sets():
  sets = transfer.transfer_datasets('imagenet', 'cifar100', 'caltech101')
  assert sets.imagenet.name.startswith('imagenet2012')
  assert (sets.cifar100.name, sets.cifar100.train_split, sets.cifar100.test_split) == (
      'cifar100', 'train', 'test')
  with pytest.raises(ValueError, match="Unknown transfer dataset key.*'imagenet21k'"):
    transfer.transfer_datasets('imagenet21k')


@pytest.mark.parametrize('key,value,match', [
    ('shots', (0, 5), 'shots'),
    ('shots', (), 'shots'),
    ('seeds', (), 'seeds'),
    ('l2_regs', (1.0, 0.0), 'l2_regs'),
    ('l2_selection', 'test_set', 'l2_selection'),
    ('holdout_fraction', 1.0, 'holdout_fraction'),
    ('batch_size', 0, 'batch_size'),
    ('every_steps', -1, 'every_steps'),
])
def test_validate_names_bad_key(key, value, match):
  cfg = transfer.default_fewshot_config().to_dict()
  cfg[key] = value
  with pytest.raises(ValueError, match=match):
    fewshot_config.validate(cfg)


def test_validate_rejects_unknown_keys_and_incomplete_datasets():
  cfg = transfer.default_fewshot_config().to_dict()
  with pytest.raises(ValueError, match=r"unknown key\(s\) \['shot'\]"):
    fewshot_config.validate({**cfg, 'shot': 1})
  cfg['datasets'] = {'digits': {'name': 'sklearn_digits', 'train_split': 'train'}}
  with pytest.raises(ValueError, match='datasets.digits must have exactly the keys'):
    fewshot_config.validate(cfg)
