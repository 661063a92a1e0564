"""Shared by the pp tests: run a pp string eagerly on one example, and test images."""
import io

import numpy as np
import tensorflow as tf
from PIL import Image

from vmoe_sparse_ot.data import pp
from vmoe_sparse_ot.data.pp_registry import SEED_KEY


def run_pp(pp_string, image=None, seed=0, training=True, **entries):
  """Applies `pp_string` eagerly to one example; numpy results."""
  example = dict(entries)
  if image is not None:
    example['image'] = tf.constant(image)
  if training:
    example[SEED_KEY] = tf.constant([7, seed], tf.int64)
  out = pp.build(pp_string, training=training)(example)
  return {k: v.numpy() for k, v in out.items() if k != SEED_KEY}


def encode(array, fmt='PNG'):
  buffer = io.BytesIO()
  Image.fromarray(array[..., 0] if array.shape[-1] == 1 else array).save(buffer, fmt)
  return buffer.getvalue()


def coords(h, w):
  """uint8 (h, w, 3) image whose pixel (y, x) is (y, x, 0): a crop tells its offset."""
  y, x = np.meshgrid(np.arange(h), np.arange(w), indexing='ij')
  return np.stack([y, x, np.zeros_like(y)], -1).astype(np.uint8)


RNG = np.random.default_rng(0)
PHOTO = RNG.integers(0, 256, (24, 40, 3), dtype=np.uint8)
# JPEG keeps smooth images nearly intact (noise it does not).
_Y, _X = np.meshgrid(np.arange(48), np.arange(64), indexing='ij')
SMOOTH = np.stack([_Y * 5, _X * 4, 128 + 60 * np.sin(_X / 6.0)], -1).astype(np.uint8)
