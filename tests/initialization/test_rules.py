"""map_onto: user rules, then the defaults (copy, upcycle, posemb zoom, new head), and reports."""
import numpy as np
import pytest

from vmoe_sparse_ot.initialization.rules import InitializationError, map_onto, parse_rules

D, H, E = 4, 6, 3


def _dense_source(num_classes=10, grid=2):
  rng = np.random.default_rng(0)
  src = {
      'cls': rng.normal(size=(1, 1, D)),
      'encoder/pos_embedding': rng.normal(size=(1, 1 + grid * grid, D)),
      'head/kernel': rng.normal(size=(D, num_classes)),
      'head/bias': rng.normal(size=(num_classes,)),
  }
  for b in (0, 1):
    src[f'encoder/encoderblock_{b}/mlp/Dense_0/kernel'] = rng.normal(size=(D, H))
    src[f'encoder/encoderblock_{b}/mlp/Dense_0/bias'] = rng.normal(size=(H,))
    src[f'encoder/encoderblock_{b}/mlp/Dense_1/kernel'] = rng.normal(size=(H, D))
    src[f'encoder/encoderblock_{b}/mlp/Dense_1/bias'] = rng.normal(size=(D,))
  return src


def _moe_target(num_classes=10, grid=2):
  """Block 0 dense, block 1 an MoE layer with E experts."""
  target = {
      'cls': (1, 1, D), 'encoder/pos_embedding': (1, 1 + grid * grid, D),
      'head/kernel': (D, num_classes), 'head/bias': (num_classes,),
      'encoder/encoderblock_0/mlp/Dense_0/kernel': (D, H),
      'encoder/encoderblock_0/mlp/Dense_0/bias': (H,),
      'encoder/encoderblock_0/mlp/Dense_1/kernel': (H, D),
      'encoder/encoderblock_0/mlp/Dense_1/bias': (D,),
      'encoder/encoderblock_1/moe/experts/wi_kernel': (E, D, H),
      'encoder/encoderblock_1/moe/experts/wi_bias': (E, H),
      'encoder/encoderblock_1/moe/experts/wo_kernel': (E, H, D),
      'encoder/encoderblock_1/moe/experts/wo_bias': (E, D),
      'encoder/encoderblock_1/moe/router/kernel': (D, E),
  }
  return target


def test_dense_into_moe_upcycles_and_copies_the_rest():
  src = _dense_source()
  out = map_onto(src, _moe_target(), num_prefix_tokens=1)
  blk = 'encoder/encoderblock_1'
  for ours, dense in (('wi_kernel', 'Dense_0/kernel'), ('wi_bias', 'Dense_0/bias'),
                      ('wo_kernel', 'Dense_1/kernel'), ('wo_bias', 'Dense_1/bias')):
    for e in range(E):
      np.testing.assert_array_equal(out.params[f'{blk}/moe/experts/{ours}'][e],
                                    src[f'{blk}/mlp/{dense}'])
  for name in ('cls', 'encoder/pos_embedding', 'head/kernel',
               'encoder/encoderblock_0/mlp/Dense_1/kernel'):
    np.testing.assert_array_equal(out.params[name], src[name])
  assert f'{blk}/moe/router/kernel' not in out.params    # The router starts fresh ...
  assert out.uninitialized == [] and out.unused == []    # ... and is not "unmatched".
  assert len(out.log) == 1 and out.log[0].startswith('upcycled 1 MoE layer(s)')
  assert '3 experts' in out.log[0]


def test_another_label_set_and_resolution_zoom_and_reinit():
  out = map_onto(_dense_source(num_classes=10, grid=2), _moe_target(num_classes=7, grid=3),
                 num_prefix_tokens=1)
  assert 'head/kernel' not in out.params and 'head/bias' not in out.params
  assert out.params['encoder/pos_embedding'].shape == (1, 10, D)
  text = ' | '.join(out.log)
  assert 'position embedding resized from a 2x2 to a 3x3 patch grid' in text
  assert 'head re-initialized' in text and '(4, 10)' in text and '(4, 7)' in text
  assert out.uninitialized == [] and out.unused == []


def test_unmatched_names_are_listed_both_ways():
  src = _dense_source()
  src['pre_logits/kernel'] = np.zeros((D, D))
  del src['cls']
  out = map_onto(src, _moe_target(), num_prefix_tokens=1)
  assert out.uninitialized == ['cls']
  assert out.unused == ['pre_logits/kernel']


def test_shape_mismatch_names_both_keys_and_shapes():
  target = _moe_target()
  target['encoder/encoderblock_0/mlp/Dense_0/kernel'] = (D, H + 1)
  with pytest.raises(InitializationError) as e:
    map_onto(_dense_source(), target)
  msg = str(e.value)
  assert '\n' not in msg
  assert ('source encoder/encoderblock_0/mlp/Dense_0/kernel (4, 6) -> target '
          'encoder/encoderblock_0/mlp/Dense_0/kernel (4, 7)') in msg


def _wider_experts(target, width):
  blk = 'encoder/encoderblock_1/moe/experts'
  target[f'{blk}/wi_kernel'], target[f'{blk}/wi_bias'] = (E, D, width), (E, width)
  target[f'{blk}/wo_kernel'] = (E, width, D)
  return target


def test_experts_of_another_width_are_refused_naming_the_key():
  """model.encoder.moe.mlp_dim: neither upcycling a dense MLP of hidden size H nor
  copying experts of hidden size H fits experts of another; one line names the key."""
  wide = _wider_experts(_moe_target(), H + 2)
  with pytest.raises(InitializationError) as e:
    map_onto(_dense_source(), wide)
  msg = str(e.value)
  assert '\n' not in msg and msg.startswith('default: encoder/encoderblock_1/mlp/Dense_0/bias'), msg
  assert msg.endswith("the experts' hidden size is 8, the source's 6: set "
                      'model.encoder.moe.mlp_dim (None: model.encoder.mlp_dim)'), msg
  moe_source = {k: np.zeros(v) for k, v in _moe_target().items()}
  with pytest.raises(InitializationError) as e:
    map_onto(moe_source, wide)
  msg = str(e.value)
  assert ('source encoder/encoderblock_1/moe/experts/wi_bias (3, 6) -> target '
          'encoder/encoderblock_1/moe/experts/wi_bias (3, 8)') in msg
  assert "the experts' hidden size is 8, the source's 6: set model.encoder.moe.mlp_dim" in msg
  # Of the same width, the experts copy; another expert count is not a width.
  assert not map_onto(_dense_source(), _wider_experts(_moe_target(), H)).uninitialized
  fewer = dict(_moe_target(), **{'encoder/encoderblock_1/moe/experts/wi_bias': (E - 1, H)})
  with pytest.raises(InitializationError) as e:
    map_onto(moe_source, fewer)
  assert 'mlp_dim' not in str(e.value)


def test_rules_rename_drop_and_transform_in_order():
  src = _dense_source()
  src['old/table'] = np.arange(6.0)
  target = _moe_target()
  target['new/table'] = (2, 3)
  rules = parse_rules([
      (r'old/(.*)', r'new/\1', 'reshape'),
      (r'head/.*', ''),                                   # Dropped: not "unused".
      (r'encoder/encoderblock_1/mlp/Dense_0/(kernel|bias)',
       r'encoder/encoderblock_1/moe/experts/wi_\1', 'upcycle'),
      (r'.*Dense_0.*', ''),                               # Shadowed for block 1 by the rule above.
  ])
  out = map_onto(src, target, rules, num_prefix_tokens=1)
  np.testing.assert_array_equal(out.params['new/table'], np.arange(6.0).reshape(2, 3))
  np.testing.assert_array_equal(out.params['encoder/encoderblock_1/moe/experts/wi_bias'][2],
                                src['encoder/encoderblock_1/mlp/Dense_0/bias'])
  assert 'encoder/encoderblock_0/mlp/Dense_0/kernel' in out.uninitialized   # Dropped by rule 3.
  assert out.unused == []
  assert out.sources['new/table'] == 'old/table'


@pytest.mark.parametrize('rules,message', [
    ([('zzz/.*', '')], r"initialization.rules\[0\] \('zzz/.\*'\) matches no source parameter"),
    ([('cls', 'nope')], r'initialization.rules\[0\] maps cls to nope, which the model does not'),
    ([('cls', 'cls', 'reshape'), ('cls', 'x')], r'initialization.rules\[1\] .* matches no'),
    ([('encoder/pos_embedding', 'cls', 'reshape')], r'initialization.rules\[0\]: .*reshape'),
])
def test_bad_rules_are_one_line_naming_the_rule(rules, message):
  with pytest.raises(InitializationError, match=message) as e:
    map_onto(_dense_source(), _moe_target(), parse_rules(rules), num_prefix_tokens=1)
  assert '\n' not in str(e.value)


@pytest.mark.parametrize('rules,message', [
    (['x'], r'rules\[0\] must be \(regex, replacement\[, transform\]\)'),
    ([('(', '')], r'rules\[0\]: bad regex'),
    ([('a', 'b', 'rotate')], r"rules\[0\]: unknown transform 'rotate'"),
    ([('a', 'b'), ('a', 1)], r'rules\[1\]: regex and replacement must be strings'),
])
def test_parse_rules_refuses_malformed_rules(rules, message):
  with pytest.raises(InitializationError, match=message):
    parse_rules(rules)
