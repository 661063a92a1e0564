"""checkpoints.resume: when a run may resume, with one line naming every difference."""
import jax
import numpy as np
import pytest

from vmoe_sparse_ot.checkpoints import resume
from vmoe_sparse_ot.errors import ResumeMismatchError

MODEL = {'name': 'vit', 'hidden_size': 8, 'encoder': {'num_layers': 2}}
PARAMS = {'a': {'kernel': jax.ShapeDtypeStruct((2, 3), np.float32)}, 'b': np.zeros(5)}


def test_param_shapes_names_every_leaf_with_its_shape():
  assert resume.param_shapes(PARAMS) == {'a/kernel': [2, 3], 'b': [5]}


def test_same_model_and_shapes_resume():
  meta = {'model_config': MODEL, 'param_shapes': {'a/kernel': [2, 3], 'b': [5]}}
  resume.check_compatible(meta, MODEL, PARAMS, 'W')   # No exception.


def test_every_model_key_and_parameter_shape_that_differs_is_named_in_one_line():
  meta = {'model_config': {**MODEL, 'hidden_size': 4},
          'param_shapes': {'a/kernel': [4, 3], 'old': [1]}}
  with pytest.raises(ResumeMismatchError) as e:
    resume.check_compatible(meta, MODEL, PARAMS, 'W')
  assert str(e.value) == (
      'The checkpoint in W does not match the config; use a fresh --workdir or the config '
      'it was trained with. Differences: model.hidden_size: checkpoint 4, config 8; '
      'param a/kernel: checkpoint shape [4, 3], config shape [2, 3]; '
      'param b: checkpoint shape <absent>, config shape [5]; '
      'param old: checkpoint shape [1], config shape <absent>')


def test_a_long_list_of_differences_is_cut_after_twelve():
  meta = {'model_config': MODEL, 'param_shapes': {f'p{i:02d}': [i] for i in range(12)}}
  # 14 in all (a/kernel and b are absent from the checkpoint): the 12 first, sorted.
  with pytest.raises(ResumeMismatchError, match=r'param p09: checkpoint shape \[9\], config '
                     r'shape <absent>; \.\.\. and 2 more$'):
    resume.check_compatible(meta, MODEL, PARAMS, 'W')


EXPECTED = {'data': {'name': 'mnist', 'sampling': 'index'}, 'optimizer': {'name': 'adam'},
            'schedule': {'name': 'cosine'}, 'train_steps': 100}


def test_a_different_input_stream_or_optimizer_never_resumes():
  meta = {**EXPECTED, 'step': 7, 'data': {'name': 'mnist'}}   # Recorded before 'sampling'.
  with pytest.raises(ResumeMismatchError) as e:
    resume.check_resume(meta, EXPECTED, 'W', allow_schedule_change=True)
  assert str(e.value) == (
      "The checkpoint in W was trained on a different input stream: dataset.sampling: "
      "checkpoint '<absent>', config 'index'. (A checkpoint without dataset.sampling read "
      "its data with config.dataset.sampling='stream': set it to resume.) Use a fresh "
      "--workdir.")
  meta = {**EXPECTED, 'step': 7, 'optimizer': {'name': 'sgd'}}
  with pytest.raises(ResumeMismatchError, match=r"^Cannot resume from step 7 in W: the "
                     r"optimizer differs from the checkpoint's: optimizer.name: checkpoint "
                     r"'sgd', config 'adam'\. "):
    resume.check_resume(meta, EXPECTED, 'W', allow_schedule_change=True)


def test_a_schedule_change_resumes_only_when_allowed_and_is_returned():
  meta = {**EXPECTED, 'step': 7, 'train_steps': 50}
  with pytest.raises(ResumeMismatchError, match=r'^Resuming from step 7 in W would change the '
                     r'learning-rate schedule: train_steps: checkpoint 50, config 100\. '):
    resume.check_resume(meta, EXPECTED, 'W')
  assert resume.check_resume(meta, EXPECTED, 'W', allow_schedule_change=True) == [
      'train_steps: checkpoint 50, config 100']
  # What the checkpoint does not record is not compared.
  assert resume.check_resume({'step': 7}, EXPECTED, 'W') == []
