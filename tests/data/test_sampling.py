"""Index arithmetic of the streams: per-process positions, seeded epoch orders."""
import numpy as np
import pytest

from vmoe_sparse_ot.data import sampling


def test_global_positions_by_hand():
  # b=2, P=3: global batch t is positions [6t, 6t+6); process 1 holds rows 2, 3.
  np.testing.assert_array_equal(sampling.global_positions(np.arange(6), 2, 1, 3),
                                [2, 3, 8, 9, 14, 15])
  np.testing.assert_array_equal(sampling.global_positions(np.arange(3), 3, 0, 1), [0, 1, 2])


@pytest.mark.parametrize('n', [1, 2, 3, 7, 64, 1000, 1437])
def test_permute_is_a_bijection_that_changes_with_seed_and_epoch(n):
  orders = [sampling.permute(np.arange(n), n, seed, epoch)
            for seed, epoch in [(0, 0), (0, 1), (1, 0)]]
  for order in orders:
    assert order.dtype == np.int64
    np.testing.assert_array_equal(np.sort(order), np.arange(n))
  if n >= 64:
    assert not np.array_equal(orders[0], orders[1])
    assert not np.array_equal(orders[0], orders[2])
    assert abs(np.corrcoef(orders[0], np.arange(n))[0, 1]) < 0.2  # Actually shuffled.
  # Element-wise: any subset of positions maps as the whole order does.
  np.testing.assert_array_equal(sampling.permute(np.arange(n)[::-1], n, 0, 1), orders[1][::-1])


def test_two_processes_read_disjoint_records_whose_union_is_each_epoch():
  n, b, p_count = 1000, 10, 2
  per_epoch = n // p_count  # Local positions of one process in one epoch.
  reads = [sampling.record_indices(sampling.global_positions(np.arange(2 * per_epoch), b, p,
                                                             p_count), n, seed=5)
           for p in range(p_count)]
  for epoch in range(2):
    mine = [r[epoch * per_epoch:(epoch + 1) * per_epoch] for r in reads]
    assert not set(mine[0]) & set(mine[1])
    np.testing.assert_array_equal(np.sort(np.concatenate(mine)), np.arange(n))
  assert not np.array_equal(reads[0][:per_epoch], reads[0][per_epoch:])


def test_positions_are_computed_at_any_step():
  # A restart at step t reads exactly the records the uninterrupted run reads
  # there, computed from t: the same at t = 3 and t = 10**12.
  n, b = 1437, 8
  whole = sampling.record_indices(np.arange(40 * b), n, seed=2)
  np.testing.assert_array_equal(sampling.record_indices(np.arange(37 * b, 38 * b), n, seed=2),
                                whole[37 * b:38 * b])
  late = sampling.record_indices(np.arange(10**12 * b, (10**12 + 1) * b), n, seed=2)
  assert late.min() >= 0 and late.max() < n and len(set(late)) == b


def test_bad_arguments():
  with pytest.raises(ValueError, match='num_records=0'):
    sampling.permute(np.arange(1), 0, 0)
  with pytest.raises(ValueError, match=r'index must be in \[0, num_records=5\)'):
    sampling.permute(np.arange(6), 5, 0)
