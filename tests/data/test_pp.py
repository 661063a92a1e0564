"""data.pp: the grammar, one-line errors, random ops, whole strings (ours and the reference's)."""
import numpy as np
import pytest
import tensorflow as tf

from tests.data.pp_helpers import SMOOTH, coords, encode, run_pp
from vmoe_sparse_ot.data import pp

IMAGENET21K_TRAIN = ("decode_jpeg_and_inception_crop(224)|flip_lr|randaug(2,20)|value_range(-1,1)|"
                     "onehot(21843,key='label',key_result='labels')|keep('image','labels','label')")



def test_parse_reads_literals_and_keeps_bars_inside_strings():
  calls = pp.parse("decode | resize((3, 4), method='area') |keep('a|b', \"c\")|flip_lr")
  assert [(c.name, c.args, c.kwargs) for c in calls] == [
      ('decode', (), {}), ('resize', ((3, 4),), {'method': 'area'}),
      ('keep', ('a|b', 'c'), {}), ('flip_lr', (), {})]
  assert pp.parse('') == () and pp.parse('  ') == ()
  assert pp.is_random('decode|flip_lr') and not pp.is_random('decode|resize(4)')


BAD_PP = [
    ('flipp', "unknown op 'flipp'; ops: central_crop, copy, decode, "),
    ('resize(-1)', "op 'resize(-1)': size=-1 must be a positive integer or a pair (height, "
     "width); accepts resize(size, method='bilinear', antialias=False, key='image', "
     'key_result=None)'),
    ('resize(sise=3)', "op 'resize(sise=3)': missing a required argument: 'size'; accepts "),
    ('resize(4, 5, 6, 7)', "op 'resize(4, 5, 6, 7)': too many positional arguments; accepts "),
    ("resize(4, method='cubic')", "method='cubic' must be one of ['bilinear', "),
    ('inception_crop(area_min=50, area_max=20)', 'must satisfy 0 < area_min <= area_max <= 100'),
    ('onehot(0)', "op 'onehot(0)': depth=0 must be a positive integer (the number of classes); "
     "accepts onehot(depth, key='labels', key_result=None, multi=True, on=1.0, off=0.0)"),
    ("onehot(10, on='x')", "on='x' must be a number"),
    ('value_range(0, 1, in_min=3, in_max=3)', 'in_min=3 and in_max=3 must differ'),
    ('randaug(-1)', 'num_layers=-1 must be an integer >= 0; accepts randaug(num_layers=2, '),
    ('randaug(2, -5)', 'magnitude=-5 must be a number >= 0'),
    ('decode(channels=2)', 'channels=2 must be 1 or 3'),
    ('keep()', 'keys must be one or more entry names'),
    ('central_crop(key=3)', 'key=3 must be the name of an entry'),
    ('resize(x)', "'resize(x)': arguments must be Python literals"),
    ('resize(**{"size": 3})', '* and ** arguments are not allowed'),
    ('decode|', 'not a pp string (invalid syntax'),
    ('decode + resize(3)', "'decode + resize(3)' is not an op"),
    ('os.system("x")', "is not an op"),
]


@pytest.mark.parametrize('string,message', BAD_PP, ids=[s for s, _ in BAD_PP])
def test_bad_strings_fail_in_one_line_naming_the_op(string, message):
  with pytest.raises(pp.PPError) as info:
    pp.build(string, training=True)
  assert message in str(info.value) and '\n' not in str(info.value)


def test_random_ops_are_refused_for_evaluation():
  for op in ('flip_lr', 'random_crop(4)', 'inception_crop', 'randaug(2, 10)',
             'decode_jpeg_and_inception_crop(8)'):
    assert pp.OPS[pp.parse(op)[0].name].random
    with pytest.raises(pp.PPError, match='is random: evaluation preprocessing must be '
                       'deterministic'):
      pp.build(f'decode|{op}', training=False)
  pp.build('decode|resize_small(8)|central_crop(8)|value_range(-1, 1)', training=False)


def test_every_op_the_issue_names_is_registered():
  assert {'decode', 'decode_jpeg_and_inception_crop', 'inception_crop', 'resize',
          'resize_small', 'central_crop', 'random_crop', 'flip_lr', 'value_range', 'randaug',
          'onehot', 'keep', 'copy'} <= set(pp.OPS)



def test_imagenet21k_train_string_gives_the_model_input_and_is_seeded():
  # Eager here (tracing RandAugment's 16 branches takes seconds); test_randaug and
  # test_pipeline run ops inside tf.data.
  jpeg = encode(SMOOTH, 'JPEG')
  first, again, other = [run_pp(IMAGENET21K_TRAIN, jpeg, seed=seed, label=tf.constant(5, tf.int64))
                         for seed in (0, 0, 1)]
  for out in (first, other):
    assert out['image'].shape == (224, 224, 3) and out['image'].dtype == np.float32
    assert -1 <= out['image'].min() and out['image'].max() <= 1
    assert out['labels'].shape == (21843,) and out['labels'][5] == 1 and out['label'] == 5
  np.testing.assert_array_equal(first['image'], again['image'])
  assert not np.array_equal(first['image'], other['image'])


def test_reference_pp_strings_verbatim_with_its_argument_names():
  """The reference code's spelling: inkey / outkey, resize_size / resize_method."""
  image = coords(8, 4)
  # Its ImageNet evaluation string, as its configs write it (double quotes included).
  out = run_pp('decode|resize(resize_size=4, resize_method="nearest")|value_range(-1, 1)|'
               'onehot(5, inkey="label", outkey="labels")|keep("image", "labels")',
               training=False, image=encode(image), label=tf.constant(3, tf.int64))
  assert sorted(out) == ['image', 'labels']
  ours = run_pp("decode|resize(4, method='nearest')|value_range(-1, 1)", training=False,
                image=encode(image))
  np.testing.assert_array_equal(out['image'], ours['image'])
  np.testing.assert_array_equal(out['labels'], [0, 0, 0, 1, 0])
  # onehot(..., key=) reads and writes one entry, as `key` does there.
  same = run_pp('onehot(3, key="label", on=0.9, off=0.05)', training=False,
                label=tf.constant(1, tf.int64))
  np.testing.assert_allclose(same['label'], [0.05, 0.9, 0.05])
  # Multi-label data (ImageNet ReaL) becomes one multi-hot vector.
  multi = run_pp('onehot(4, inkey="real_label", outkey="labels")', training=False,
                 real_label=tf.constant([0, 2], tf.int64))
  np.testing.assert_array_equal(multi['labels'], [1, 0, 1, 0])
  with pytest.raises(pp.PPError, match='inkey= and key= name the same argument'):
    pp.build('onehot(3, inkey="label", key="label")', training=False)

