"""Few-shot evaluation configuration: every key `config.fewshot` accepts, with defaults.

The same function is re-exported as `vmoe_sparse_ot.evaluate.transfer.default_fewshot_config`.

Datasets are a dict `{key: {name, train_split, test_split}}`: `name` is a TFDS name
(or one of the embedded datasets), the few-shot training examples are drawn from
`train_split`, accuracy is measured on all of `test_split`, and metrics are named
`fewshot/<key>/<shot>shot`. The default uses the embedded datasets, which need no
download. The paper's configs (JFT upstream) evaluate ImageNet 10-shot and the
usual transfer sets instead, e.g.

    config.fewshot.datasets = transfer_datasets('imagenet', 'cifar100', 'caltech101')
    config.fewshot.shots = (10,)      # the paper reports ImageNet 10-shot top-1
"""
from typing import Any, Mapping

import ml_collections

from vmoe_sparse_ot.config_keys import check_keys
from vmoe_sparse_ot.data import pp as pp_lib
from vmoe_sparse_ot.values import is_int

# How the ridge's L2 is chosen (evaluate.ridge, evaluate.transfer): leave-one-out or
# a held-out split of the few-shot examples, or the reference V-MoE code's rule
# (on the test split's accuracy, one L2 per shot for all datasets and seeds).
L2_SELECTIONS = ('loo', 'holdout', 'reference')

DATASET_KEYS = ('name', 'train_split', 'test_split')

# TFDS names and splits of the usual transfer sets (as in big_vision's few-shot
# configs). ImageNet draws its shots from the 10% subset of train, which holds
# ~128 images per class, so feature extraction does not sweep all 1.28M images.
TRANSFER_DATASETS = {
    'imagenet': ('imagenet2012_subset/10pct', 'train', 'validation'),
    'cifar10': ('cifar10', 'train', 'test'),
    'cifar100': ('cifar100', 'train', 'test'),
    'caltech101': ('caltech101', 'train', 'test'),
    'cub': ('caltech_birds2011', 'train', 'test'),
    'flowers': ('oxford_flowers102', 'train', 'test'),
    'pets': ('oxford_iiit_pet', 'train', 'test'),
    'dtd': ('dtd', 'train', 'test'),
    # Embedded, no download: scikit-learn's 8x8 digits (resized to the model's
    # input) and MNIST, whose shots come from the first 2000 validation images
    # (>= 184 per class; the MNIST configs train on 'train' only, and extracting
    # 2000 rather than 10000 keeps periodic evaluation cheap) and whose accuracy is
    # on the held-out test split.
    'digits': ('sklearn_digits', 'train', 'test'),
    'mnist': ('embedded_mnist', 'validation[:2000]', 'test'),
}


def transfer_datasets(*keys: str) -> ml_collections.ConfigDict:
  """`{key: {name, train_split, test_split}}` for the named `TRANSFER_DATASETS` keys."""
  unknown = [k for k in keys if k not in TRANSFER_DATASETS]
  if unknown:
    raise ValueError(f'Unknown transfer dataset key(s) {unknown}; known: '
                     f'{sorted(TRANSFER_DATASETS)}.')
  return ml_collections.ConfigDict({
      k: {'name': TRANSFER_DATASETS[k][0], 'train_split': TRANSFER_DATASETS[k][1],
          'test_split': TRANSFER_DATASETS[k][2]}
      for k in keys})


def default_fewshot_config() -> ml_collections.ConfigDict:
  """All few-shot keys; `config.fewshot` starts from this and overrides what it needs."""
  return ml_collections.ConfigDict({
      # Periodic evaluation during training: on the first step, every `every_steps`
      # and on the last step. 0 disables it (the standalone job still works).
      'every_steps': 0,
      # Examples per class in the few-shot training set.
      'shots': (1, 5, 10, 25),
      # One few-shot draw (and holdout split) per seed; metrics average over seeds.
      # The paper averages 5 seeds.
      'seeds': (0, 1, 2, 3, 4),
      # Candidate ridge L2 strengths, 2^-10 ... 2^19.
      'l2_regs': tuple(2.0**k for k in range(-10, 20)),
      # How the L2 strength is chosen without the test split: 'loo' (closed-form
      # leave-one-out on the few-shot set) or 'holdout' (hold out `holdout_fraction`
      # of each class, then refit on all). 1-shot falls back to leave-one-out MSE.
      # See vmoe_sparse_ot/evaluate/ridge.py. 'reference': the reference V-MoE
      # code's ridge (features scaled by std + 1e-5, a bias column of 100) and
      # rule, to compare with its published numbers: per shot, the L2 of best mean
      # rank by test accuracy over every dataset and seed, reported for all of
      # them (it selects on the test split; evaluate/transfer.py).
      'l2_selection': 'loo',
      'holdout_fraction': 0.2,
      # Global batch size of feature extraction (over all processes; a multiple of
      # the process count, and of the device count when sharded).
      'batch_size': 256,
      'datasets': transfer_datasets('digits', 'mnist'),
      # A preprocessing string for every few-shot image (docs/PREPROCESSING.md), e.g.
      # the reference V-MoE code's 'decode|resize(256)|central_crop(224)|value_range(-1,
      # 1)|keep("image", "label")'; it must give 'image' at the model's input shape and
      # the integer 'label'. None: decoded and resized to config.dataset.image_size.
      'pp': ml_collections.FieldReference(None, field_type=str),
  })


def validate(fewshot: Mapping[str, Any]) -> None:
  """Raises ValueError (one line, naming the full key and value) for a bad `config.fewshot`."""
  check_keys(fewshot, default_fewshot_config().keys(), 'config.fewshot')

  def fail(key, allowed):
    raise ValueError(f'config.fewshot.{key}={fewshot[key]!r}: {allowed}')

  if not is_int(fewshot['every_steps']) or fewshot['every_steps'] < 0:
    fail('every_steps', 'must be an integer >= 0 (0 disables periodic few-shot)')
  shots, seeds, l2_regs = fewshot['shots'], fewshot['seeds'], fewshot['l2_regs']
  if not shots or any(not is_int(s) or s < 1 for s in shots):
    fail('shots', 'must be one or more integers >= 1')
  if not seeds or any(not is_int(s) for s in seeds):
    fail('seeds', 'must be one or more integers')
  if not l2_regs or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0
                        for v in l2_regs):
    fail('l2_regs', 'must be one or more numbers > 0')
  if fewshot['l2_selection'] not in L2_SELECTIONS:
    fail('l2_selection', f'must be one of {list(L2_SELECTIONS)}')
  if not 0 < fewshot['holdout_fraction'] < 1:
    fail('holdout_fraction', 'must be in (0, 1)')
  if not is_int(fewshot['batch_size']) or fewshot['batch_size'] < 1:
    fail('batch_size', 'must be an integer >= 1')
  if fewshot['pp'] is not None:
    if not isinstance(fewshot['pp'], str) or not fewshot['pp'].strip():
      fail('pp', 'must be a pp string such as "decode|resize(224)|value_range(-1, 1)" or None')
    try:
      pp_lib.build(fewshot['pp'], training=False)  # The parser: no TensorFlow.
    except ValueError as e:
      fail('pp', str(e))
  for key, spec in fewshot['datasets'].items():
    if not hasattr(spec, 'keys') or sorted(spec.keys()) != sorted(DATASET_KEYS):
      raise ValueError(f'config.fewshot.datasets.{key} must have exactly the keys '
                       f'{list(DATASET_KEYS)}, got {spec!r}')
