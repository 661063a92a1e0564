"""data.pp_registry: registering ops, the key / key_result wrapper, entries and seeds."""
import numpy as np
import pytest
import tensorflow as tf

from vmoe_sparse_ot.data import pp_registry
from vmoe_sparse_ot.data.pp_registry import OPS, SEED_KEY


@pytest.fixture
def registered():
  """Names registered by a test, removed from the registry afterwards."""
  names = []
  yield names
  for name in names:
    OPS.pop(name, None)


def test_register_records_the_builder_once_and_refuses_a_second_one(registered):
  registered.append('_test_twice')

  @pp_registry.register('_test_twice', random=True)
  def builder(depth, scale=2.0):
    return lambda data: data

  assert OPS['_test_twice'] == pp_registry.OpSpec('_test_twice', builder, True)
  assert OPS['_test_twice'].usage() == '_test_twice(depth, scale=2.0)'
  with pytest.raises(KeyError, match="pp op '_test_twice' is registered twice"):
    pp_registry.register('_test_twice')(builder)


def test_image_op_reads_key_and_writes_key_result(registered):
  registered.append('_test_affine')

  @pp_registry.image_op('_test_affine')
  def affine(scale, shift=0):
    return lambda x: x * scale + shift

  spec = OPS['_test_affine']
  assert not spec.random
  assert spec.usage() == "_test_affine(scale, shift=0, key='image', key_result=None)"
  example = {'image': 2, 'other': 5}
  assert spec.builder(3)(example) == {'image': 6, 'other': 5}
  assert spec.builder(3, shift=1, key='other', key_result='out')(example) == {
      'image': 2, 'other': 5, 'out': 16}
  assert example == {'image': 2, 'other': 5}  # The input is not changed.
  for bad in ({'key': ''}, {'key': 3}, {'key_result': ''}):
    with pytest.raises(ValueError, match='must be the name of an entry'):
      spec.builder(3, **bad)


def test_a_random_image_op_gets_a_fresh_seed_and_advances_the_examples(registered):
  registered.append('_test_seeded')

  @pp_registry.image_op('_test_seeded', random=True)
  def seeded():
    return lambda x, seed: seed

  op = OPS['_test_seeded'].builder()
  seed = tf.constant([7, 0], tf.int64)
  out = op({'image': tf.zeros([1]), SEED_KEY: seed})
  expected = tf.random.experimental.stateless_split(seed, 2).numpy()
  np.testing.assert_array_equal(out[SEED_KEY], expected[0])
  np.testing.assert_array_equal(out['image'], expected[1])
  with pytest.raises(ValueError, match="pp op '_test_seeded' is random and needs a "
                     'per-example seed'):
    op({'image': tf.zeros([1])})


def test_get_names_the_op_and_the_entries_there_are():
  assert pp_registry.get({'a': 1}, 'a', 'op') == 1
  with pytest.raises(ValueError) as info:
    pp_registry.get({'b': 1, 'a': 2, SEED_KEY: 0}, 'c', 'resize')
  assert str(info.value) == ("pp op 'resize' reads entry 'c', which the example does not have "
                             '(entries: a, b); pass key=...')
