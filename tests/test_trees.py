"""trees: dotted and slash names of nested things, leaf shapes and their differences."""
from typing import Any, NamedTuple

import jax
import numpy as np
from flax.core import FrozenDict

from vmoe_sparse_ot import trees


def test_flatten_gives_dotted_keys_and_json_lists():
  tree = {'model': {'encoder': {'num_layers': 2, 'patch': (4, 4)}, 'dtype': None},
          'seed': 0, 'empty': {}}
  assert trees.flatten(tree) == {'model.encoder.num_layers': 2, 'model.encoder.patch': [4, 4],
                                 'model.dtype': None, 'seed': 0}
  assert trees.flatten({'a': 1}, prefix='config.') == {'config.a': 1}


def test_flatten_tree_gives_slash_paths_in_sorted_order_for_any_pytree():
  x, y, z = np.zeros(2), np.ones(3), np.arange(4)
  tree = {'head': {'kernel': x}, 'encoder': FrozenDict({'block_0': {'bias': y}}),
          'skip': None, 'list': [z]}
  flat = trees.flatten_tree(tree)
  # dict keys sorted (jax's order); a list's entries as [i]; None holds no leaf.
  assert list(flat) == ['encoder/block_0/bias', 'head/kernel', 'list/[0]']
  assert flat['head/kernel'] is x and flat['encoder/block_0/bias'] is y and flat['list/[0]'] is z
  assert trees.flatten_tree({}) == {}


class _Pair(NamedTuple):
  first: Any
  second: Any


def test_path_name_joins_dict_keys_attribute_names_and_indices():
  paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(
      {'a': [1, {'b': 2}], 'p': _Pair(3, 4)})[0]]
  assert [trees.path_name(p) for p in paths] == ['a/[0]', 'a/[1]/b', 'p/first', 'p/second']


def test_leaf_shapes_of_arrays_and_shape_structs_are_lists():
  tree = {'w': np.zeros((2, 3)), 'b': jax.ShapeDtypeStruct((3,), np.float32),
          's': np.float32(1.0)}
  assert trees.leaf_shapes(tree) == {'b': [3], 's': [], 'w': [2, 3]}


def test_shape_differences_lists_changed_missing_and_extra_names_sorted():
  have = {'b/kernel': (4, 32), 'a/bias': [8], 'same': [2, 2], 'only_have': [1]}
  want = {'b/kernel': [8, 32], 'a/bias': (8,), 'same': (2, 2), 'only_want': [3, 4]}
  assert trees.shape_differences(have, want) == [
      'b/kernel: [4, 32] -> [8, 32]',
      'only_have: [1] -> <absent>',
      'only_want: <absent> -> [3, 4]',
  ]
  assert trees.shape_differences(have, want, labels=('checkpoint', 'model')) == [
      'b/kernel: checkpoint [4, 32], model [8, 32]',
      'only_have: checkpoint [1], model <absent>',
      'only_want: checkpoint <absent>, model [3, 4]',
  ]
  assert trees.shape_differences(have, dict(have)) == []
  assert trees.shape_differences({}, {}) == []


def test_differences_write_values_with_show_and_name_the_missing_side():
  have = {'model.dtype': 'float32', 'model.k': 1, 'model.only_have': None}
  want = {'model.dtype': 'bfloat16', 'model.k': 1, 'model.only_want': [2, 2]}
  assert trees.differences(have, want, labels=('checkpoint', 'config'), show=repr) == [
      "model.dtype: checkpoint 'float32', config 'bfloat16'",
      "model.only_have: checkpoint None, config '<absent>'",
      "model.only_want: checkpoint '<absent>', config [2, 2]",
  ]
  assert trees.differences({'a': 1}, {'a': 2}) == ['a: 1 -> 2']
  assert trees.differences(have, dict(have)) == []

