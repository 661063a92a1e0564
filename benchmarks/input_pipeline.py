"""Input pipeline throughput on synthetic ImageNet-like JPEGs, per pp string, in one run.

Writes (once, under --data_dir) a TFDS dataset of 500 x 375 JPEGs with 1000
classes -- smooth random colour fields with noise, so that each JPEG is about
the size of a photo's -- then reads it through `data.make_dataset` with each
preprocessing string below and reports images per second of wall time and per
CPU-second (the process's user + system time: images per second per core, and
steady when other processes load the machine). Each string is read for
--batches batches after --warmup batches (the shuffle buffer fill and tracing
excluded), --rounds times in a row; the best round is reported. Strings run one
after the other, each stream closed before the next starts.

    python benchmarks/input_pipeline.py [--data_dir DIR] [--examples 1000] [--cores 1]

--sampling picks `data.make_dataset`'s record order(s): 'index' (each process's
own records by random access, the default) and 'stream' (the sequential reader
with a shuffle buffer). --cores N pins the process to N cores before TensorFlow starts (its thread
pools then size themselves to N). The strings: the eval pp, and the train pp
with and without RandAugment, each with the fused crop-then-decode
(`decode_jpeg_and_inception_crop`) and with decode-then-crop.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

PP = {
    'eval: decode, resize_small(256), central_crop':
        'decode|resize_small(256)|central_crop(224)|value_range(-1, 1)',
    'train: fused crop + decode, flip':
        'decode_jpeg_and_inception_crop(224)|flip_lr|value_range(-1, 1)',
    'train: decode, then crop, flip':
        'decode|inception_crop(224)|flip_lr|value_range(-1, 1)',
    'train: fused, flip, randaug(2,20)':
        'decode_jpeg_and_inception_crop(224)|flip_lr|randaug(2, 20)|value_range(-1, 1)',
    'train: decode then crop, flip, randaug(2,20)':
        'decode|inception_crop(224)|flip_lr|randaug(2, 20)|value_range(-1, 1)',
}
ONEHOT = "|onehot(1000, key='label', key_result='labels')"
NAME = 'synthetic_imagenet_jpeg'


def synthetic_jpeg(rng, height=375, width=500):
  """JPEG bytes of a smooth random colour field with noise (about a photo's size)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  import io  # pylint: disable=g-import-not-at-top
  coarse = rng.uniform(0, 255, size=(6, 8, 3))
  image = np.asarray(Image.fromarray(coarse.astype(np.uint8)).resize((width, height),
                                                                     Image.BICUBIC), np.float64)
  image += rng.normal(0, 18, size=image.shape)
  buffer = io.BytesIO()
  Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(buffer, 'JPEG', quality=90)
  return buffer.getvalue()


def make_builder_class(num_examples: int):
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  class SyntheticImagenetJpeg(tfds.core.GeneratorBasedBuilder):
    """500 x 375 synthetic JPEGs, 1000 classes (benchmarks/input_pipeline.py)."""
    VERSION = tfds.core.Version(f'1.0.{num_examples}')
    name = NAME

    def _info(self):
      return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
          'image': tfds.features.Image(shape=(None, None, 3), encoding_format='jpeg'),
          'label': tfds.features.ClassLabel(num_classes=1000)}))

    def _split_generators(self, dl_manager):
      del dl_manager
      return {'train': self._generate_examples()}

    def _generate_examples(self):
      rng = np.random.default_rng(0)
      for i in range(num_examples):
        # Already JPEG bytes: TFDS stores them as they are.
        yield i, {'image': synthetic_jpeg(rng), 'label': int(rng.integers(1000))}

  return SyntheticImagenetJpeg


def cpu_seconds() -> float:
  t = os.times()
  return t.user + t.system


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument('--data_dir', default=os.path.join(tempfile.gettempdir(), 'vmoe_bench_tfds'))
  p.add_argument('--examples', type=int, default=1000)
  p.add_argument('--batch', type=int, default=64)
  p.add_argument('--batches', type=int, default=8, help='timed batches per round')
  p.add_argument('--warmup', type=int, default=3)
  p.add_argument('--rounds', type=int, default=3)
  p.add_argument('--cores', type=int, default=None, help='pin to this many cores')
  p.add_argument('--only', default=None, help='run only the strings whose label contains this')
  p.add_argument('--sampling', default='index,stream',
                 help="data.make_dataset's sampling modes to run, comma-separated")
  args = p.parse_args(argv)
  if args.cores:
    os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:args.cores]))
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from vmoe_sparse_ot import data  # pylint: disable=g-import-not-at-top

  builder = make_builder_class(args.examples)(data_dir=args.data_dir)
  if not builder.is_prepared():
    t0 = time.perf_counter()
    tfds.disable_progress_bar()
    builder.download_and_prepare()
    print(f'wrote {args.examples} JPEGs under {args.data_dir} in {time.perf_counter() - t0:.0f} s')
  size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(builder.data_dir)
             for f in fs if 'tfrecord' in f)
  print(f'{NAME}: {args.examples} JPEGs of 500 x 375, {size / args.examples / 1e3:.0f} kB each; '
        f'cores: {len(os.sched_getaffinity(0))}, batch {args.batch}')

  wall, cpu = {}, {}
  runs = [(f'{label} [{sampling}]' if ',' in args.sampling else label, pp, sampling)
          for label, pp in PP.items() if not args.only or args.only in label
          for sampling in args.sampling.split(',')]
  for label, pp, sampling in runs:
    # One stream at a time (a live stream keeps prefetching in the background,
    # which would count against the next one's CPU time).
    ds = data.make_dataset(NAME, 'train', batch_size=args.batch, image_size=224, channels=3,
                           training=True, data_dir=args.data_dir, pp=pp + ONEHOT,
                           shuffle_buffer=1000, process_index=0, process_count=1,
                           sampling=sampling)
    it = iter(ds.as_numpy_iterator())
    for _ in range(args.warmup):
      next(it)
    wall[label], cpu[label] = [], []
    for _ in range(args.rounds):
      t0, c0 = time.perf_counter(), cpu_seconds()
      for _ in range(args.batches):
        next(it)
      n = args.batches * args.batch
      wall[label].append(n / (time.perf_counter() - t0))
      cpu[label].append(n / max(cpu_seconds() - c0, 1e-9))
    del it, ds
  base = max(cpu[next(iter(cpu))])
  print(f"\n{'pp string (+ onehot(1000)) [sampling]':<56}{'images/s':>10}{'images/CPU-s':>14}"
        f"{'vs first':>10}")
  for label in wall:
    print(f'{label:<56}{max(wall[label]):>10.0f}{max(cpu[label]):>14.0f}'
          f'{max(cpu[label]) / base:>9.2f}x')
  return 0


if __name__ == '__main__':
  sys.exit(main())
