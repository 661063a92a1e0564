"""config_keys.check_keys: the one check for unknown config keys."""
import ml_collections
import pytest

from vmoe_sparse_ot.config_keys import check_keys


def test_known_keys_pass_whether_valid_is_a_sequence_or_a_mapping():
  assert check_keys({'a': 1}, ('a', 'b'), 'config.x') is None
  assert check_keys(ml_collections.ConfigDict({'b': 2}), {'a': 0, 'b': 0}, 'config.x') is None
  assert check_keys({}, (), 'config.x') is None


def test_unknown_keys_are_one_line_naming_them_where_and_the_valid_ones_sorted():
  with pytest.raises(ValueError) as info:
    check_keys(ml_collections.ConfigDict({'zz': 1, 'b': 2, 'routr': 3}), ('name', 'b', 'a'),
               'config.model.encoder.moe')
  assert str(info.value) == ("unknown key(s) ['routr', 'zz'] in config.model.encoder.moe; "
                             "valid keys: ['a', 'b', 'name']")
