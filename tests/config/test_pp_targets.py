"""config.pp_targets: what a pp string's output must hold for the loss, mixup and evaluation."""
from vmoe_sparse_ot.config import pp_targets

IMAGE = ((28, 28, 1), 'float32')


def _problem(entries, **kw):
  args = dict(pp_key='dataset.pp_train', pp='P', num_classes=10, loss='softmax_xent',
              training=True)
  return pp_targets.problem(entries, **{**args, **kw})


def test_pp_output_against_loss_and_mixup():
  label, labels = ((), 'int32'), ((10,), 'float32')
  assert _problem({'image': IMAGE, 'label': label}) is None
  assert _problem({'image': IMAGE, 'labels': labels}, loss='sigmoid_xent', mixup_p=0.2) is None
  assert _problem({'image': IMAGE, 'label': label}, mixup_p=0.2) == (
      "config.mixup.p=0.2: mixup needs one-hot 'labels' float32 (10,) from "
      "config.dataset.pp_train; add onehot(10, key='label', key_result='labels') to it")
  assert _problem({'image': IMAGE, 'label': label}, loss='sigmoid_xent', training=False,
                  pp_key='dataset.pp_eval', pp=None) == (
      "config.loss.name='sigmoid_xent': needs one-hot or multi-hot 'labels' float32 (10,) "
      "from config.dataset.pp_eval; a pp string ending with onehot(10, key='label', "
      "key_result='labels')")
  assert _problem({'image': IMAGE, 'labels': ((5,), 'float32')}) == (
      "config.dataset.pp_train: pp 'P' gives 'labels' float32 of shape (5,); the loss reads "
      'float32 (10,) (config.model.num_classes=10)')
  assert _problem({'image': IMAGE}).startswith(
      "config.dataset.pp_train: pp 'P' leaves no integer 'label' (entries: image)")
  assert _problem({'image': IMAGE, 'label': ((None,), 'int32'), 'labels': labels},
                  training=False, pp_key='evaluate.datasets.real.pp') == (
      "config.evaluate.datasets.real.pp: pp 'P' gives entry 'label' of varying shape "
      '(None,); evaluation needs fixed shapes (drop it with keep(...) or drop(...))')
