"""`evaluate.released.read_weights`: a checkpoint without a workdir on the config's model,
taken exactly as it is (no shape or array is read from a model other than by tracing)."""
import os

import numpy as np
import pytest

from tests.evaluate.conftest import tiny_config, write_released
from vmoe_sparse_ot.evaluate import released as released_lib
from vmoe_sparse_ot.initialization import flatten_tree, npz


@pytest.fixture(scope='module')
def model_config():
  return tiny_config().model.to_dict()


def test_weights_are_the_checkpoints(released, model_config):
  prefix, arrays = released
  weights = released_lib.read_weights(prefix, model_config)
  assert weights.image_shape == (28, 28, 1) and weights.ignored == []
  flat = flatten_tree(weights.params)
  assert sorted(flat) == sorted(arrays) == sorted(weights.param_shapes)
  for name, value in arrays.items():
    assert flat[name].dtype == np.float32
    np.testing.assert_array_equal(flat[name], value)


def _refused(prefix, model_config, *fragments):
  with pytest.raises(ValueError) as info:
    released_lib.read_weights(prefix, model_config)
  message = str(info.value)
  assert '\n' not in message and message.startswith('--checkpoint') and prefix in message, message
  for fragment in fragments:
    assert fragment in message, message


def test_a_checkpoint_that_is_not_the_model_is_refused(released, model_config, tmp_path):
  arrays = dict(released[1])
  head = arrays.pop('head/kernel')
  write_released(arrays, str(tmp_path / 'no_head'))
  _refused(str(tmp_path / 'no_head'), model_config, "does not fit the config's model",
           'head re-initialized (the source has none)')
  deeper = dict(released[1])
  deeper['encoder/encoderblock_2/norm_att/scale'] = np.ones(16, np.float32)
  write_released(deeper, str(tmp_path / 'deeper'))
  _refused(str(tmp_path / 'deeper'), model_config,
           "1 of its parameter(s) not in the config's model: "
           'Encoder/encoderblock_2/LayerNorm_0/scale')
  wide = dict(released[1], **{'head/kernel': np.zeros((16, 12), np.float32)})
  wide['head/bias'] = np.zeros(12, np.float32)
  write_released(wide, str(tmp_path / 'wide'))
  _refused(str(tmp_path / 'wide'), model_config, 'head re-initialized (source (16, 12) -> '
           'target (16, 10))')
  # Entries outside the model's names (an optimizer's, a step) are ignored and listed.
  extra = dict(released[1], **{'opt_state/mu/head/kernel': head, 'step': np.int32(4)})
  npz.write_npz(str(tmp_path / 'extra.npz'), extra)
  weights = released_lib.read_weights(str(tmp_path / 'extra.npz'), model_config)
  assert weights.ignored == ['opt_state/mu/head/kernel', 'step']
  (tmp_path / 'junk').write_bytes(b'not a checkpoint')
  _refused(str(tmp_path / 'junk'), model_config, 'neither an .npz file')
  os.remove(str(tmp_path / 'no_head.data-00001-of-00002'))
  _refused(str(tmp_path / 'no_head'), model_config, 'no_head.data-00001-of-00002: missing')
