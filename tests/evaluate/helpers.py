"""Synthetic few-shot data and a tiny feature model shared by the evaluate tests."""
import flax.linen as flax_nn
import numpy as np


def clusters(seed, num_classes, per_class, dim=32, noise=0.05):
  """(features, labels): Gaussian clusters around class centres fixed across seeds.

  Labels come shuffled; centres are N(0, 9) per coordinate, so with the default
  noise the classes are linearly separable by a wide margin.
  """
  centres = np.random.default_rng(1234).normal(size=(num_classes, dim)) * 3.0
  rng = np.random.default_rng(seed)
  labels = rng.permutation(np.repeat(np.arange(num_classes), per_class))
  return centres[labels] + noise * rng.normal(size=(len(labels), dim)), labels


class LinearModel(flax_nn.Module):
  """`logits, aux = apply(images, train)` with aux['pre_logits'] = a linear map."""

  @flax_nn.compact
  def __call__(self, images, train):
    del train
    pre = flax_nn.Dense(6, name='pre')(images.reshape(images.shape[0], -1))
    return flax_nn.Dense(3, name='head')(pre), {'pre_logits': pre}


def batches(images, labels, batch_size):
  """Padded full batches with a mask, like data.make_dataset(training=False)."""
  n = len(labels)
  pad = -n % batch_size
  images = np.concatenate([images, np.full((pad,) + images.shape[1:], 7.0, np.float32)])
  labels = np.concatenate([labels, np.full(pad, -1, np.int32)])
  mask = np.arange(n + pad) < n
  return [{'image': images[i:i + batch_size], 'label': labels[i:i + batch_size],
           'mask': mask[i:i + batch_size]} for i in range(0, n + pad, batch_size)]


def image_data(seed, n, num_classes=3):
  patterns = np.random.default_rng(99).normal(size=(num_classes, 4, 4, 1))
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, num_classes, size=n).astype(np.int32)
  images = patterns[labels] + 0.05 * rng.normal(size=(n, 4, 4, 1))
  return images.astype(np.float32), labels
