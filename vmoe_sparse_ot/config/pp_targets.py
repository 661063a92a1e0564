"""What a pp string's output must hold for the configured loss, mixup and evaluation.

`problem(...)` looks at the entries a pp string gives (traced by
`data.trace_pp`: {entry: (shape, dtype name)}) and returns the one-line message
of the first thing the trainer could not use, naming the config key, or None:

- float targets 'labels', when present, are (num_classes,) (the logits' size);
- `loss.name='sigmoid_xent'` (training and evaluation) and `mixup.p > 0`
  (training) need 'labels';
- without 'labels', an integer 'label' per example (the softmax loss and the
  accuracy read it);
- evaluation entries have fixed shapes (evaluation batches are padded).

Pure Python, so it is tested on hand-written entries.
"""
from __future__ import annotations

from typing import Mapping, Sequence

Entries = Mapping[str, tuple[Sequence[int | None], str]]


def _onehot(num_classes: int) -> str:
  return f"onehot({num_classes}, key='label', key_result='labels')"


def problem(entries: Entries, *, pp_key: str, pp: str | None, num_classes: int,
            loss: str, mixup_p: float = 0.0, training: bool) -> str | None:
  """The first reason `entries` do not fit, as 'config.KEY...: ...', or None."""
  where = f'config.{pp_key}'
  shown = 'pp None' if pp is None else f'pp {pp!r}'
  add = (f'a pp string ending with {_onehot(num_classes)}' if pp is None
         else f'add {_onehot(num_classes)} to it')
  want = f'float32 ({num_classes},)'
  labels = entries.get('labels')
  if labels is not None:
    shape, dtype = tuple(labels[0]), labels[1]
    if shape != (num_classes,) or not dtype.startswith(('float', 'bfloat')):
      return (f"{where}: {shown} gives 'labels' {dtype} of shape {shape}; the loss reads "
              f'{want} (config.model.num_classes={num_classes})')
  else:
    if loss == 'sigmoid_xent':
      return (f"config.loss.name='sigmoid_xent': needs one-hot or multi-hot 'labels' {want} "
              f'from {where}; {add}')
    if training and mixup_p > 0:
      return (f"config.mixup.p={mixup_p!r}: mixup needs one-hot 'labels' {want} from "
              f'{where}; {add}')
    label = entries.get('label')
    if label is None or tuple(label[0]) != () or not label[1].startswith(('int', 'uint')):
      return (f"{where}: {shown} leaves no integer 'label' (entries: "
              f"{', '.join(sorted(entries))}); the trainer reads it, or one-hot 'labels' "
              f'({_onehot(num_classes)})')
  if not training:
    for key, (shape, _) in sorted(entries.items()):
      if any(d is None for d in shape):
        return (f'{where}: {shown} gives entry {key!r} of varying shape {tuple(shape)}; '
                'evaluation needs fixed shapes (drop it with keep(...) or drop(...))')
  return None
