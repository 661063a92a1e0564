"""The training config's layout: every key the trainer reads, with its default.

Config files in `configs/` start from `base_config()` and return it locked, so a
typo'd key fails instead of being silently ignored. The allowed values of each
key are checked in `config/validation.py`.
"""
from __future__ import annotations

import ml_collections

from vmoe_sparse_ot.config.fewshot_section import default_fewshot_config
from vmoe_sparse_ot.nn.model_config import default_model_config

OPTIMIZERS = ('adam', 'adamw', 'sgd', 'adafactor')
# optimizer.param_naming: this project's parameter names, or the reference V-MoE's.
PARAM_NAMINGS = ('ours', 'vmoe')
AUGMENTATIONS = ('none', 'inception_crop_flip')
SAMPLINGS = ('index', 'stream')  # data/pipeline.py
# Each schedule and the `config.schedule` keys it reads beside SCHEDULE_KEYS.
SCHEDULE_EXTRA_KEYS = {
    'warmup_linear_decay': (),
    'warmup_cosine_decay': (),
    'warmup_constant': (),
    'constant': (),
    'warmup_polynomial_decay': ('power',),
    'warmup_exponential_decay': ('transition_steps', 'decay_rate', 'transition_begin',
                                 'staircase'),
    'big_vision_rsqrt': ('timescale', 'cooldown_steps'),
}
SCHEDULES = tuple(SCHEDULE_EXTRA_KEYS)
SCHEDULE_KEYS = ('name', 'peak_value', 'end_value', 'warmup_steps', 'decay_steps')


def schedule_record(schedule) -> dict:
  """The keys of `config.schedule` its schedule reads (what a checkpoint records):
  the keys of the schedules that predate the others are all a record holds, so
  older checkpoints compare equal."""
  keys = SCHEDULE_KEYS + SCHEDULE_EXTRA_KEYS.get(schedule['name'], ())
  return {k: schedule[k] for k in keys}
LOSSES = ('softmax_xent', 'sigmoid_xent')  # train/losses.py
MIXUP_GRANULARITIES = ('batch', 'device', 'example')  # train/mixup.py
# Keys of one config.evaluate.datasets entry and their defaults (None: from
# config.dataset; 'split' must be given).
EVAL_DATASET_KEYS = {'dataset': None, 'split': None, 'pp': None, 'label_key': 'label'}
MESH_AXES = ('data', 'expert')


def base_config() -> ml_collections.ConfigDict:
  """Every key the trainer reads, with defaults (unlocked; config files lock it)."""
  return ml_collections.ConfigDict({
      'model': default_model_config(),
      'dataset': {
          # An embedded dataset ('embedded_mnist', 'sklearn_digits') or a prepared
          # TFDS name (e.g. 'imagenet2012' under `data_dir`).
          'name': 'embedded_mnist',
          'train_split': 'train',
          'eval_split': 'test',
          'image_size': 28,
          'channels': 1,
          'data_dir': ml_collections.FieldReference(None, field_type=str),
          # How the training stream is read (docs/PREPROCESSING.md, "Input per
          # host"): 'index' (each process reads its own records by random access,
          # a seeded permutation per epoch; resume costs the same at any step) or
          # 'stream' (the former reader: every process reads every record through a
          # shuffle buffer of shuffle_buffer examples; resume replays the stream).
          'sampling': 'index',
          'shuffle_buffer': 10_000,
          # Preprocessing strings (docs/PREPROCESSING.md), e.g.
          # 'decode_jpeg_and_inception_crop(224)|flip_lr|value_range(-1, 1)' for
          # training and 'decode|resize(384)|value_range(-1, 1)' for evaluation
          # (deterministic: no random ops). Each maps {'image': encoded string,
          # 'label': int} to 'image' float32 (image_size, image_size, channels)
          # and keeps the integer 'label' the loss reads. None: from `augment`.
          'pp_train': ml_collections.FieldReference(None, field_type=str),
          'pp_eval': ml_collections.FieldReference(None, field_type=str),
          # The older spelling of both pp strings: 'none' or 'inception_crop_flip'
          # (see data.pipeline.legacy_pp); None: by dataset (none for digits).
          # Set either augment or the pp strings.
          'augment': ml_collections.FieldReference(None, field_type=str),
      },
      # Global batch sizes (over all processes); each process reads its share.
      'batch_size': 64,
      'eval_batch_size': 256,
      # Gradient accumulation: each step's batch is split into this many
      # microbatches whose gradients are averaged before the one update (the
      # same update, the activation memory of batch_size / microsteps).
      'microsteps': 1,
      'train_steps': 1000,
      'optimizer': {
          # 'adam' / 'adamw': Adam with decoupled weight decay (AdamW), the decay
          # scaled by the learning rate schedule as in V-MoE; 'sgd': momentum SGD;
          # 'adafactor': factored second moments (decay 1 - t^-0.8 capped at b2)
          # and an average of the updates with `momentum`.
          'name': 'adam',
          'b1': 0.9,
          'b2': 0.999,
          'eps': 1e-8,
          'momentum': 0.9,
          # dtype of Adam's first moment / the momentum ('bfloat16' halves it);
          # None: the parameters' dtype.
          'mu_dtype': ml_collections.FieldReference(None, field_type=str),
          # A float, for the parameters matching weight_decay_regex; or, as in the
          # reference code, a list of (regex, value): each parameter decays with the
          # value of the first regex its '/'-joined path matches (none: no decay),
          # and weight_decay_regex is not read.
          'weight_decay': ml_collections.FieldReference(0.0, field_type=object),
          # Parameters whose '/'-joined path matches get a float weight_decay.
          'weight_decay_regex': r'(^|/)[^/]*kernel$',
          # Clip gradients to this global norm; None: no clipping.
          'gradient_clip_norm': ml_collections.FieldReference(None, field_type=float),
          # Parameters whose '/'-joined path matches (re.search) are kept fixed:
          # no update, no weight decay (their gradients count in the clipping norm,
          # as in the reference). None: train all.
          'freeze': ml_collections.FieldReference(None, field_type=str),
          # The names the regexes of weight_decay, weight_decay_regex and freeze
          # are matched against: 'ours' (encoder/encoderblock_1/moe/experts/wi_kernel)
          # or 'vmoe', the reference V-MoE's (Encoder/encoderblock_1/Moe/Mlp/
          # Dense_0/kernel), as its config files write them (set when one is
          # translated).
          'param_naming': 'ours',
      },
      # Cross-entropy against (1 - s) one-hot + s / num_classes (training only;
      # softmax_xent only).
      'label_smoothing': 0.0,
      'loss': {
          # 'softmax_xent': softmax cross-entropy against the one-hot 'labels' when
          # the pp string makes them, else the integer 'label'. 'sigmoid_xent':
          # multi-label, the sum over classes of binary cross-entropies against
          # 'labels' (one-hot or multi-hot; the V-MoE ImageNet-21k recipe).
          'name': 'softmax_xent',
      },
      'mixup': {
          # Mixup of each training batch with itself rolled by one, with one ratio
          # per step from Beta(p, p) folded into [1/2, 1], on the images and the
          # one-hot 'labels' (pp_train must make them). 0: off. The reference's
          # ImageNet recipes use 0.2 (light) or 0.5 (strong); p is its
          # `concentration`. See vmoe_sparse_ot/train/mixup.py.
          'p': 0.0,
          # Who shares one set of mixing weights: 'batch' (one per step, the whole
          # global batch rolled as one), 'device' (one per device shard of the
          # batch, each shard rolled on its own; the reference's recipes) or
          # 'example' (one per example, rolled per device shard).
          'granularity': 'batch',
          # How many examples each mixed example combines (itself and the size - 1
          # before it); > 2 draws the weights from a Dirichlet(p, ..., p), sorted so
          # the largest is the example's own.
          'size': 2,
      },
      # A TensorBoard profile (jax.profiler) of some training steps, written to
      # WORKDIR/plugins/profile/ beside the run's events (train/profiling.py).
      'profile': {
          # The first profiled step; None or 0: no profile.
          'first_profile': ml_collections.FieldReference(None, field_type=int),
          # How many steps each profile covers.
          'num_profile_steps': 5,
          # Profile again once this many seconds passed since the last one
          # started; None: once.
          'every_secs': ml_collections.FieldReference(None, field_type=float),
          # Profile on every process; False: process 0 only.
          'all_processes': False,
      },
      'evaluate': {
          # Datasets evaluated beside dataset.eval_split, at the same steps:
          # {NAME: {'dataset': ..., 'split': ..., 'pp': ..., 'label_key': ...}},
          # logged as eval/NAME/loss, eval/NAME/accuracy. dataset and pp default to
          # config.dataset's name and pp_eval, label_key (the feature read as
          # 'label') to 'label'. See vmoe_sparse_ot/train/periodic_eval.py.
          'datasets': {},
          # Model keys replaced for every evaluation during training and the
          # final one, as a nested dict over config.model, e.g. {'encoder': {'moe':
          # {'router': {'capacity_factor': 4.0}}}} (the reference's
          # evaluate.model_overrides): another capacity factor, router or K over
          # the same parameters; a key that changes a parameter's shape is
          # refused. {}: the training model.
          'model_overrides': {},
      },
      # Parameters taken from other weights before the first step of a fresh run
      # (never the optimizer state or the step; a resumed run ignores this).
      # See vmoe_sparse_ot.initialization and docs/INITIALIZATION.md.
      'initialization': {
          # A workdir of this project, an .npz file, or a reference V-MoE
          # partitioned checkpoint prefix (PREFIX.index + PREFIX.data-*); None: off.
          'path': ml_collections.FieldReference(None, field_type=str),
          # Checkpoint step of a workdir source; None: its latest that restores.
          'step': ml_collections.FieldReference(None, field_type=int),
          # Ordered (regex, replacement[, transform]) over source names (in this
          # project's naming); the first full match renames, '' drops the entry.
          # Transforms: 'upcycle', 'zoom_posemb', 'reshape'.
          'rules': (),
          # Model parameters the source leaves uninitialized are an error (the
          # head of another label set and upcycled routers are never counted).
          'raise_if_target_unmatched': True,
          # Source entries that initialize nothing are an error (else listed).
          'raise_if_source_unmatched': False,
      },
      'schedule': {
          'name': 'warmup_linear_decay',
          'peak_value': 1e-3,
          'end_value': 1e-5,
          'warmup_steps': 100,
          # Steps from the end of warmup to `end_value`; None: until train_steps.
          # (The reference code counts its decay_steps from step 0: subtract
          # warmup_steps to translate one of its configs.)
          'decay_steps': ml_collections.FieldReference(None, field_type=int),
          # warmup_polynomial_decay: (1 - t / decay_steps) ** power from peak to end.
          'power': 1.0,
          # warmup_exponential_decay (optax's): peak * decay_rate ** ((t - warmup -
          # transition_begin) / transition_steps), floored at end_value;
          # staircase: whole transitions only.
          'transition_steps': 1000,
          'decay_rate': 0.5,
          'transition_begin': 0,
          'staircase': False,
          # big_vision_rsqrt: peak / sqrt(1 + (t - warmup) / timescale), then a linear
          # cooldown to 0 over the last cooldown_steps of warmup + decay_steps.
          'timescale': 10_000,
          'cooldown_steps': 0,
      },
      'mesh': {
          # Devices along 'expert' (expert parameters are split over it); -1: the
          # largest count dividing both the devices and the experts. 'data' takes
          # the remaining devices when -1. The batch is split over both axes.
          'data': -1,
          'expert': 1,
      },
      'checkpoint': {
          'every_steps': 500,
          'keep': 2,
          'async_save': True,
          # Checkpoints at steps that are multiples of this are kept forever
          # beside the last `keep` ones (e.g. cooldown snapshots), as the reference's
          # save_checkpoint.keep_steps_multiple_of; only steps that are saved
          # (multiples of every_steps) can be kept. 0: off.
          'keep_steps_multiple_of': 0,
      },
      'log_every_steps': 50,
      # Peak FLOP/s of one device, for the train rows' `mfu` (train/compute.py);
      # None: from the table of common GPUs and TPUs there (none on CPU: no mfu).
      'peak_flops_per_device': ml_collections.FieldReference(None, field_type=float),
      # 0 disables periodic evaluation; the final step is always evaluated.
      'eval_every_steps': 500,
      'fewshot': default_fewshot_config(),
      'seed': 0,
  })
