r"""Pictures of a training workdir: `python -m vmoe_sparse_ot.plot WORKDIR [--out DIR]`.

Writes PNGs into DIR (default WORKDIR/plots):
- `curves.png`: training loss and accuracy (averaged as the trainer logs them),
  evaluation loss and top-1, and the learning rate, against the step;
- `expert_load.png`: per MoE layer, tokens per expert in a group (min-max band and
  mean, with the capacity C), the fractions of tokens that 0 (dropped), 1 and 2 or
  more experts processed, and the max load violation (max load / mean load - 1);
  and, for runs that log them, the router's health: the entropy of its softmax
  over experts and the experts that got no token (a collapse shows here first);
- `routing.png`: for a few evaluation images, which expert takes each patch at
  every MoE layer (the expert with the largest combine weight; grey: dropped);
- `fewshot.png` when WORKDIR/fewshot/results.json exists: few-shot top-1 against
  the number of shots per dataset (mean and std over seeds).

Curves come from the TensorBoard event files the trainer writes in WORKDIR
(`tensorboard --logdir WORKDIR` shows the same); the routing picture restores the
latest checkpoint and builds the model from the checkpoint's own model config.
A mistake (a missing workdir, a --dataset, --split or --data_dir the routing
picture cannot read, an --out that cannot be created) is one line on stderr and
exit status 2, before any figure is written.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Sequence

from vmoe_sparse_ot import workdir_layout
from vmoe_sparse_ot import quiet_logs

quiet_logs.setup_environment()  # Before TensorFlow loads (tensorboard, data).

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax
from matplotlib import colors as mcolors
import ml_collections
import numpy as np
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from vmoe_sparse_ot import checkpoints
from vmoe_sparse_ot import data
from vmoe_sparse_ot import errors
from vmoe_sparse_ot import filesystem
from vmoe_sparse_ot import nn
from vmoe_sparse_ot import plotting_style
from vmoe_sparse_ot.config.preflight import check_directory
from vmoe_sparse_ot.config.preflight import make_directory
from vmoe_sparse_ot.evaluate import overrides as eval_overrides

PROG = 'python -m vmoe_sparse_ot.plot'
Series = dict[str, tuple[np.ndarray, np.ndarray]]


def read_scalars(workdir: str) -> Series:
  """{tag: (steps, values)} of every scalar in WORKDIR's TensorBoard event files."""
  acc = event_accumulator.EventAccumulator(
      workdir, size_guidance={event_accumulator.TENSORS: 0, event_accumulator.SCALARS: 0})
  acc.Reload()
  tags = acc.Tags()
  out: Series = {}
  for tag in tags.get(event_accumulator.SCALARS, []):
    events = acc.Scalars(tag)
    out[tag] = (np.array([e.step for e in events]), np.array([e.value for e in events]))
  # CLU's SummaryWriter writes scalars as rank-0 tensors.
  for tag in tags.get(event_accumulator.TENSORS, []):
    events = acc.Tensors(tag)
    values = [tensor_util.make_ndarray(e.tensor_proto) for e in events]
    if not values or np.ndim(values[0]) != 0 or values[0].dtype.kind not in 'fiu':
      continue
    out[tag] = (np.array([e.step for e in events]), np.array(values, np.float64))
  return out


def eval_set_names(scalars: Series) -> list[str]:
  """Names of the extra eval sets (`config.evaluate.datasets`: eval/NAME/loss ...)."""
  return sorted({tag.split('/')[1] for tag in scalars
                 if tag.startswith('eval/') and tag.count('/') == 2
                 and tag.endswith(('/loss', '/accuracy'))})


def curve_panels(scalars: Series) -> list[tuple[str, list[tuple[str, str]], str]]:
  """[(title, [(tag, legend label)], y label)] of the panels with something logged.

  The run's eval set is 'eval'; each extra eval set is one more line, 'eval NAME'.
  """
  extra = eval_set_names(scalars)
  panels = [
      ('Loss', [('loss', 'train (interval mean)'), ('eval/loss', 'eval')]
       + [(f'eval/{name}/loss', f'eval {name}') for name in extra], 'cross-entropy'),
      ('Top-1 accuracy', [('accuracy', 'train'), ('eval/accuracy', 'eval')]
       + [(f'eval/{name}/accuracy', f'eval {name}') for name in extra], 'accuracy'),
      ('Learning rate', [('learning_rate', 'schedule')], 'learning rate'),
  ]
  return [p for p in panels if any(tag in scalars for tag, _ in p[1])]


def plot_curves(scalars: Series, path: str, title: str = '') -> str | None:
  """Loss, accuracy and learning rate against the step; None if nothing was logged."""
  panels = curve_panels(scalars)
  if not panels:
    return None
  fig, axes = plotting_style.figure(1, len(panels), panel=(4.2, 3.2))
  for ax, (name, series, ylabel) in zip(axes[0], panels):
    ax.grid(True)
    for tag, label in series:
      if tag in scalars:
        steps, values = scalars[tag]
        ax.plot(steps, values, marker='o' if len(steps) < 12 else None, markersize=3,
                label=label)
    ax.set_title(name)
    ax.set_xlabel('training step')
    ax.set_ylabel(ylabel)
    if len([t for t, _ in series if t in scalars]) > 1:
      ax.legend()
  if title:
    fig.suptitle(title)
  return plotting_style.save(fig, path)


def _moe_layers(scalars: Series) -> list[str]:
  layers = {tag.split('/')[1] for tag in scalars
            if tag.startswith('routing/') and tag.endswith('/tokens_per_expert_mean')}
  return sorted(layers, key=lambda name: (len(name), name))


def plot_expert_load(scalars: Series, path: str, capacity: int | None = None,
                     title: str = '') -> str | None:
  """Per MoE layer (one column): tokens per expert, tokens by experts, max load
  violation, router health.

  Rows: tokens per expert in a group (min-max band and mean, with C); the
  fractions of tokens with 0 (dropped), 1 and 2+ experts; MaxVio (max load /
  mean load - 1, mean over groups); when logged, the router's entropy and its
  empty experts (`_plot_health`). Workdirs written before the second and third
  rows' metrics existed show the dropped fraction alone and no MaxVio curve, and
  have no fourth row.
  """
  layers = _moe_layers(scalars)
  if not layers:
    return None
  health = any(tag.endswith('/router_entropy') for tag in scalars)
  fig, axes = plotting_style.figure(3 + health, len(layers), panel=(4.2, 2.8))
  for ax in axes.flat:
    ax.grid(True)
  for col, layer in enumerate(layers):
    def series(name, layer=layer):
      return scalars.get(f'routing/{layer}/{name}')

    ax = axes[0][col]
    steps, mean = series('tokens_per_expert_mean')
    lo = (series('tokens_per_expert_min') or (steps, mean))[1]
    hi = (series('tokens_per_expert_max') or (steps, mean))[1]
    ax.fill_between(steps, lo, hi, alpha=0.25, label='min-max over experts and groups')
    ax.plot(steps, mean, label='mean')
    if capacity:
      ax.axhline(capacity, color='0.3', linestyle='--', linewidth=1, label=f'capacity C={capacity}')
    ax.set_title(f'{layer}: expert load')
    ax.set_xlabel('training step')
    ax.set_ylabel('tokens per expert in a group')
    ax.set_ylim(bottom=0)
    if col == 0:
      ax.legend(loc='lower right')

    ax = axes[1][col]
    lines = [('tokens_with_0_experts', '0 experts (dropped)', 'C3'),
             ('tokens_with_1_expert', '1 expert', 'C0'),
             ('tokens_with_2plus_experts', '2 or more experts', 'C2')]
    if series(lines[0][0]) is None:
      lines[0] = ('dropped_fraction', lines[0][1], 'C3')
    for name, label, color in lines:
      if series(name) is not None:
        steps, values = series(name)
        ax.plot(steps, 100 * values, color=color, label=label)
    ax.set_title(f'{layer}: experts per token')
    ax.set_xlabel('training step')
    ax.set_ylabel('share of tokens (%)')
    ax.set_ylim(-2, 102)
    if col == 0 and ax.lines:
      ax.legend(loc='center right')

    ax = axes[2][col]
    if series('max_load_violation') is not None:
      steps, vio = series('max_load_violation')
      ax.plot(steps, vio, color='C4')
      # Expert choice keeps it at 0: leave room below so the line is not the axis.
      top = max(1.1 * float(np.max(vio)), 0.05)
      ax.set_ylim(-0.03 * top, top)
    else:
      ax.text(0.5, 0.5, 'not logged by this run', transform=ax.transAxes, ha='center',
              va='center', color='0.4')
    ax.set_title(f'{layer}: max load violation')
    ax.set_xlabel('training step')
    ax.set_ylabel('max load / mean load - 1')
    if health:
      _plot_health(axes[3][col], layer, series, legend=col == 0)
  if title:
    fig.suptitle(title)
  return plotting_style.save(fig, path)


def _plot_health(ax, layer: str, series, legend: bool) -> None:
  """The router's mean entropy over experts (left axis) and its empty experts (right)."""
  lines = []
  if series('router_entropy') is not None:
    lines += ax.plot(*series('router_entropy'), color='C0', label='router entropy')
  ax.set_ylim(bottom=0)
  ax.set_ylabel('entropy of the softmax (nats)')
  ax.set_xlabel('training step')
  ax.set_title(f'{layer}: router health')
  if series('empty_experts') is not None:
    right = ax.twinx()
    steps, empty = series('empty_experts')
    lines += right.plot(steps, empty, color='C3', drawstyle='steps-post',
                        label='experts with no token')
    right.set_ylim(-0.05 * max(1.0, float(np.max(empty))), 1.1 * max(1.0, float(np.max(empty))))
    right.set_ylabel('experts with no token')
  if legend and lines:
    ax.legend(handles=lines, loc='best')


def plot_fewshot(results: dict[str, Any], path: str) -> str | None:
  """Few-shot top-1 (mean ± std over seeds) against shots, one line per dataset."""
  datasets = results.get('datasets') or {}
  if not datasets:
    return None
  fig, axes = plotting_style.figure(1, 1, panel=(5.0, 3.6))
  ax = axes[0][0]
  ax.grid(True)
  for key, ds in datasets.items():
    shots = sorted(ds['shots'], key=int)
    x = [int(s) for s in shots]
    mean = np.array([100 * ds['shots'][s]['accuracy_mean'] for s in shots])
    std = np.array([100 * ds['shots'][s]['accuracy_std'] for s in shots])
    ax.errorbar(x, mean, yerr=std, marker='o', capsize=3, label=f"{key} ({ds.get('name', key)})")
  ax.set_xscale('log')
  all_shots = sorted({int(s) for ds in datasets.values() for s in ds['shots']})
  ax.set_xticks(all_shots)
  ax.set_xticklabels([str(s) for s in all_shots])
  ax.minorticks_off()
  ax.set_xlabel('examples per class (shots)')
  ax.set_ylabel('top-1 on the test split (%)')
  model = results.get('model') or {}
  router = f", router {model['router']}" if model.get('router') else ''
  ax.set_title(f"Few-shot linear transfer at step {results.get('step', '?')}"
               f"\n({model.get('name', 'model')}{router}; mean ± std over seeds)")
  ax.legend()
  return plotting_style.save(fig, path)


def _input_geometry(params: Any, classifier: str, image_size: int | None = None
                    ) -> tuple[int, int, int, int]:
  """(image_size, channels, patch, tokens incl. class token) from the parameter shapes.

  A model without a learned position embedding (`position_emb` 'sincos2d' or
  'none') does not tell its image size: `image_size` (the run's) gives it then.
  """
  ph, pw, channels, _ = np.shape(params['embedding']['kernel'])
  if 'pos_embedding' in params['encoder']:
    num_tokens = np.shape(params['encoder']['pos_embedding'])[1]
  elif image_size:
    num_tokens = (image_size // ph) ** 2 + (1 if classifier == 'token' else 0)
  else:
    raise ValueError('the model has no learned position embedding and the run records no '
                     'image size: cannot tell which images to route')
  patches = num_tokens - (1 if classifier == 'token' else 0)
  side = int(round(math.sqrt(patches)))
  if side * side != patches or ph != pw:
    raise ValueError(f'cannot draw routing for a non-square patch grid ({patches} patches, '
                     f'patch {ph}x{pw})')
  return side * ph, int(channels), int(ph), int(num_tokens)


def expert_choices(model, params, images: np.ndarray, classifier: str,
                   model_state=None) -> dict[str, np.ndarray]:
  """{layer: (B, P) int} the expert with the largest combine weight per patch, -1 if none.

  Applies the model with `mutable=['intermediates']` and reads the (G, S, E) weights
  each MoE layer sows as 'expert_weights'; tokens were flattened image-major and
  cut into groups of S, so (G*S, E)[:B*N] reshapes back to (B, N, E) (an E³ model:
  member 0's routing, `nn.ensemble`). `model_state`:
  the router state to route with (`nn.router_state`; None for none).
  """
  b = images.shape[0]
  # Jitted: applied eagerly, the model compiles each of its ops on its own.
  apply = jax.jit(lambda variables, x: model.apply(variables, x, train=False,
                                                   mutable=['intermediates']))
  _, state = apply({'params': params, **(model_state or {})}, images)
  out = {}
  encoder = state['intermediates']['encoder']
  for layer in sorted(encoder, key=lambda name: (len(name), name)):
    moe = encoder[layer].get('moe') if hasattr(encoder[layer], 'get') else None
    if not moe or 'expert_weights' not in moe:
      continue
    w = np.asarray(moe['expert_weights'][0], np.float32)   # (G, S, E)
    e = w.shape[-1]
    num_tokens = np.shape(params['encoder']['pos_embedding'])[1]
    members = getattr(model, 'ensemble_size', 1)   # E³: (image, member, token) order
    w = w.reshape(-1, e)[:b * members * num_tokens].reshape(b, members, num_tokens, e)[:, 0]
    if classifier == 'token':
      w = w[:, 1:]
    choice = np.argmax(w, axis=-1)
    out[layer] = np.where(w.sum(-1) > 0, choice, -1)
  return out


def plot_routing(images: np.ndarray, choices: dict[str, np.ndarray], num_experts: int,
                 path: str, title: str = '') -> str:
  """Rows: images; columns: the image, then its patches coloured by expert per MoE layer.

  `images` (B, H, W, C) in [-1, 1]; `choices[layer]` (B, P) expert per patch or -1
  (dropped), P a square grid. The digit is drawn in white over the expert colours.
  """
  b, size = images.shape[0], images.shape[1]
  layers = list(choices)
  fig, axes = plotting_style.figure(b, 1 + len(layers), panel=(1.9, 1.9))
  palette = np.concatenate([[[0.0, 0.0, 0.0, 1.0]], plotting_style.categorical_colors(
      num_experts)])
  listed = mcolors.ListedColormap(palette)
  gray = images.mean(-1) if images.shape[-1] > 1 else images[..., 0]
  gray = np.clip((gray + 1) / 2, 0, 1)  # [-1, 1] -> [0, 1]
  for i in range(b):
    axes[i][0].imshow(gray[i], cmap='gray', vmin=0, vmax=1)
    if i == 0:
      axes[i][0].set_title('input')
    strokes = np.zeros(gray[i].shape + (4,))
    strokes[..., :3], strokes[..., 3] = 1.0, 0.75 * gray[i]
    for j, layer in enumerate(layers):
      ax = axes[i][j + 1]
      side = int(round(math.sqrt(choices[layer].shape[1])))
      grid = choices[layer][i].reshape(side, side) + 1  # 0: dropped
      ax.imshow(grid, cmap=listed, vmin=-0.5, vmax=num_experts + 0.5,
                extent=(-0.5, size - 0.5, size - 0.5, -0.5), interpolation='nearest')
      ax.imshow(strokes)
      if i == 0:
        ax.set_title(layer)
  for row in axes:
    for ax in row:
      ax.set_xticks([])
      ax.set_yticks([])
      ax.grid(False)
  handles = [plotting_style.plt.Rectangle((0, 0), 1, 1, color=palette[k])
             for k in range(1, num_experts + 1)] + [
                 plotting_style.plt.Rectangle((0, 0), 1, 1, color=palette[0])]
  fig.legend(handles, [f'expert {k}' for k in range(num_experts)] + ['dropped'],
             loc='outside lower center', ncol=min(num_experts + 1, 5), frameon=False)
  fig.suptitle(title or 'Expert with the largest combine weight, per patch and MoE layer')
  return plotting_style.save(fig, path)


def _run_config(workdir: str) -> dict[str, Any]:
  """WORKDIR/config.json (the resolved run config) if the trainer wrote one, else {}."""
  path = os.path.join(workdir, workdir_layout.CONFIG)
  if not os.path.isfile(path):
    return {}
  with open(path) as f:
    return json.load(f)


def routing_data(workdir: str, meta: dict[str, Any], *, dataset: str | None = None,
                 split: str | None = None, data_dir: str | None = None
                 ) -> tuple[str, str, str | None, dict[str, Any]]:
  """(dataset, split, data_dir, the run's dataset section) of the routing picture.

  Each is the flag's, else the run's WORKDIR/config.json's, else the checkpoint
  `meta`'s (dataset) or 'test' (split). Checked, from the dataset's metadata
  only, so that a mistake is one line naming the flag (ValueError or OSError)
  before any figure is written.
  """
  run_dataset = _run_config(workdir).get('dataset', {})
  dataset = dataset or run_dataset.get('name') or meta.get('data', {}).get('name')
  split = split or run_dataset.get('eval_split') or 'test'
  data_dir = data_dir or run_dataset.get('data_dir')
  if not dataset:
    raise ValueError('--dataset: required for the routing picture (the workdir has no '
                     'config.json and the checkpoint names no dataset; or --num_images=0)')
  if data_dir and not filesystem.is_remote(data_dir):  # TFDS reads gs:// data_dirs itself.
    check_directory(data_dir, '--data_dir')
  for flag, splits in ((f'--dataset={dataset}', []), (f'--split={split}', [split])):
    try:
      data.check_dataset(dataset, splits, data_dir)
    except (OSError, ValueError) as e:
      raise ValueError(f'{flag}: {errors.first_line(e)}') from None
  return dataset, split, data_dir, run_dataset


def routing_figure(workdir: str, path: str, *, num_images: int = 4, dataset: str | None = None,
                   split: str | None = None, data_dir: str | None = None) -> str | None:
  """Restores the latest checkpoint and draws `plot_routing` for `num_images` images."""
  params, meta, step = checkpoints.restore_params_with_meta(workdir)
  model_config = ml_collections.ConfigDict(meta['model_config'])
  if model_config.name != 'vit_moe':
    return None
  model = nn.build_model(model_config)
  dataset, split, data_dir, run_dataset = routing_data(workdir, meta, dataset=dataset,
                                                       split=split, data_dir=data_dir)
  image_size, channels, _, _ = _input_geometry(params, model_config.classifier,
                                               run_dataset.get('image_size'))
  ds = data.make_dataset(dataset, split, batch_size=num_images, image_size=image_size,
                         channels=channels, training=False, data_dir=data_dir,
                         process_index=0, process_count=1,
                         augment=run_dataset.get('augment'),
                         pp=(run_dataset.get('pp_eval')
                             if dataset == run_dataset.get('name') else None))
  batch = next(ds.as_numpy_iterator())
  images = batch['image'][:num_images]
  model_state = nn.router_state.for_model(model, (image_size, image_size, channels),
                                          checkpoints.restore_model_state(workdir, step))
  choices = expert_choices(model, params, images, model_config.classifier, model_state)
  router = model_config.encoder.moe.router.name
  num_experts = int(model_config.encoder.moe.num_experts)
  members = int(model_config.get('ensemble_size', 1) or 1)
  # E³: member 0's routing (`expert_choices`), among its own experts 0 .. E/M - 1.
  whose = f', E³ member 0 of {members}' if members > 1 else ''
  return plot_routing(
      images, choices, num_experts // members, path,
      title=f'Routing at step {step}, router {router}{whose}\n{dataset} {split}: expert '
            'with the largest\ncombine weight per patch')


def _capacity(model_config: dict[str, Any]) -> int | None:
  try:
    return eval_overrides.capacity(model_config)  # The router's own rule.
  except Exception:  # pylint: disable=broad-except  (a picture without the line is fine)
    return None


def plot_workdir(workdir: str, out: str | None = None, *, num_images: int = 4,
                 dataset: str | None = None, split: str | None = None,
                 data_dir: str | None = None) -> list[str]:
  """Writes every picture that WORKDIR has data for; returns the paths written.

  Everything a mistake can show in (the workdir, the routing picture's data, the
  output folder `out`, default WORKDIR/plots) is checked before the first figure
  is written: ValueError or OSError, one line naming the flag.
  """
  if not os.path.isdir(workdir):
    raise FileNotFoundError(f'workdir {workdir!r} is not a directory')
  out = out or os.path.join(workdir, workdir_layout.PLOTS)
  written = []
  scalars = read_scalars(workdir)
  meta = {}
  has_checkpoint = workdir_layout.has_checkpoint(workdir)
  if has_checkpoint:
    meta = checkpoints.read_meta(workdir)[0]
  meta_model = meta.get('model_config')
  routing = num_images > 0 and (meta_model or {}).get('name') == 'vit_moe'
  if routing:
    routing_data(workdir, meta, dataset=dataset, split=split, data_dir=data_dir)
  results_path = os.path.join(workdir, workdir_layout.FEWSHOT_RESULTS)
  if not scalars and not has_checkpoint and not os.path.isfile(results_path):
    raise FileNotFoundError(_nothing_to_plot(workdir))
  make_directory(out, '--out')
  label = os.path.basename(os.path.normpath(workdir))
  if meta_model and meta_model.get('name') == 'vit_moe':
    label += f" (router {meta_model['encoder']['moe']['router']['name']})"
  written.append(plot_curves(scalars, os.path.join(out, 'curves.png'), title=label))
  written.append(plot_expert_load(scalars, os.path.join(out, 'expert_load.png'),
                                  capacity=_capacity(meta_model) if meta_model else None,
                                  title=label))
  if routing:
    written.append(routing_figure(workdir, os.path.join(out, 'routing.png'),
                                  num_images=num_images, dataset=dataset, split=split,
                                  data_dir=data_dir))
  if os.path.isfile(results_path):
    with open(results_path) as f:
      written.append(plot_fewshot(json.load(f), os.path.join(out, 'fewshot.png')))
  written = [p for p in written if p]
  if not written:
    raise FileNotFoundError(_nothing_to_plot(workdir))
  return written


def _nothing_to_plot(workdir: str) -> str:
  return (f'nothing to plot in {workdir!r}: no TensorBoard events, checkpoint or '
          'fewshot/results.json')


def main(argv: Sequence[str] | None = None) -> None:
  parser = errors.ArgumentParser(
      prog=PROG, description='Writes PNGs of a training workdir: curves, expert load, '
      'routing of a few images, few-shot accuracy against shots.')
  parser.add_argument('workdir', help='training workdir (holds checkpoints/ and events)')
  parser.add_argument('--out', default=None, help='output folder (default: WORKDIR/plots)')
  parser.add_argument('--num_images', type=int, default=4,
                      help='images in the routing picture (0: skip it)')
  parser.add_argument('--dataset', default=None,
                      help="dataset of the routing picture (default: the run's)")
  parser.add_argument('--split', default=None,
                      help="split of the routing picture (default: the run's eval split)")
  parser.add_argument('--data_dir', default=None, help='TFDS data_dir of that dataset')
  args = parser.parse_args(argv)
  if args.num_images < 0:
    parser.error(f'--num_images={args.num_images} must be >= 0')
  quiet_logs.quiet_library_logs()
  try:
    paths = plot_workdir(args.workdir, args.out, num_images=args.num_images,
                         dataset=args.dataset, split=args.split, data_dir=args.data_dir)
  except (OSError, ValueError) as e:
    errors.fail(PROG, e)
  for path in paths:
    print(f'Wrote {path}')


if __name__ == '__main__':
  main()
