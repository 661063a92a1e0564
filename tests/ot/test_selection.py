"""Top-k selection (`ot.selection`): the passes and radix kernels against lax.top_k and
brute force."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.ot.helpers import densify, force_kernel, problem
from vmoe_sparse_ot import ot
from vmoe_sparse_ot.ot import objectives, optim, selection, solvers


def brute_mask(x, k, axis):
  """k largest per slice, ties to the lower index, by a stable sort of -x."""
  xs = np.moveaxis(np.asarray(x, np.float64), axis, -1)
  order = np.argsort(-xs, axis=-1, kind="stable")
  mask = np.zeros(xs.shape, bool)
  np.put_along_axis(mask, order[..., :k], True, axis=-1)
  return np.moveaxis(mask, -1, axis)


# Called eagerly, each function compiles every primitive inside it as its own
# program; jitted once here (k, axis and m static), each compiles one program
# per shape, shared by the tests and cases of this module.
_sel = jax.jit(selection.threshold_top_k_mask, static_argnums=(1, 2))
_lax_top_k = jax.jit(jax.lax.top_k, static_argnums=1)
_top_k = jax.jit(selection.top_k, static_argnames=("k", "axis"))
_top_k_mask = jax.jit(selection.top_k_mask, static_argnames=("k", "axis"))
_order_keys = jax.jit(selection._order_keys)
_kth_largest_key = jax.jit(selection.kth_largest_key, static_argnums=(1, 2))
_select_key = jax.jit(selection._select_key, static_argnames=("k", "axis", "early_exit"))


def lax_mask(x, k, axis):
  xs = np.moveaxis(np.asarray(x), axis, -1)
  _, idx = _lax_top_k(xs, k)
  mask = np.zeros(xs.shape, bool)
  np.put_along_axis(mask, np.asarray(idx), True, axis=-1)
  return np.moveaxis(mask, -1, axis)


def _inputs(dtype, seed=0):
  rng = np.random.default_rng(seed)
  ties = rng.integers(-3, 4, size=(37, 9)).astype(dtype)               # many ties
  smooth = rng.standard_normal((37, 9)).astype(dtype)
  special = smooth.copy()
  special[:5, 0] = [0.0, -0.0, -0.0, 0.0, np.inf]                     # signed zeros
  special[:, 1] = -np.inf
  special[3:7, 2] = np.float32(1e-38)
  return [ties, smooth, special]


def _check(dtype):
  x_np = np.stack(_inputs(dtype))                                       # (3, m, 9)
  x, x_t = jnp.asarray(x_np), jnp.asarray(np.swapaxes(x_np, 1, 2))
  assert x.dtype == dtype
  m = x.shape[1]
  # k = 1 and 7: the passes kernel; m - 1 = 36: the radix kernel (float64
  # along axis 1: the passes); m: no selection. (Each k compiles.)
  for k in (1, 7, m - 1, m):
    got = np.asarray(_sel(x, k, 1))
    np.testing.assert_array_equal(got, brute_mask(x, k, 1), err_msg=f"k={k}")
    np.testing.assert_array_equal(got, lax_mask(x, k, 1), err_msg=f"k={k}")
    # Along the last axis too.
    got_t = np.asarray(_sel(x_t, k, -1))
    np.testing.assert_array_equal(got_t, np.swapaxes(got, 1, 2))


def test_radix_mask_matches_lax_top_k_and_brute_force_float64():
  _check(jnp.float64)


def test_radix_mask_matches_lax_top_k_and_brute_force_float32_under_x64():
  _check(jnp.float32)


@pytest.mark.float32
def test_radix_mask_matches_lax_top_k_and_brute_force_without_x64():
  assert not jax.config.jax_enable_x64
  _check(jnp.float32)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_kth_largest_key_is_the_kth_sorted_value(dtype):
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.standard_normal((50, 6)) * 10.0 ** rng.integers(-30, 30, (50, 6)), dtype)
  keys = _order_keys(x)
  # The keys sort like the values.
  order_k = np.argsort(np.asarray(keys), axis=0, kind="stable")
  order_x = np.argsort(np.asarray(x), axis=0, kind="stable")
  np.testing.assert_array_equal(order_k, order_x)
  xs = -np.sort(-np.asarray(x), axis=0)
  for k in (1, 13, 50):
    kth = _kth_largest_key(keys, k, 0)
    np.testing.assert_array_equal(np.asarray(kth)[0],
                                  np.asarray(_order_keys(jnp.asarray(xs[k - 1]))))


def test_kernel_choice_and_top_k_mask_dispatch():
  assert not selection.uses_radix(5, 1000, jnp.float64)
  assert selection.uses_radix(575, 5000, jnp.float64)
  assert selection.uses_radix(100, 10000, jnp.float32)
  assert not selection.uses_radix(1000, 1000, jnp.float32)       # k >= m: no selection
  # Along the minor axis (base-4 variadic passes) the radix kernel starts earlier.
  assert selection.uses_radix(32, 1000, jnp.float64, minor_axis=True)
  assert not selection.uses_radix(32, 1000, jnp.float64)
  assert selection.uses_radix(16, 1000, jnp.float32, minor_axis=True)
  assert not selection.uses_radix(16, 1000, jnp.float64, minor_axis=True)
  rng = np.random.default_rng(2)
  x = jnp.asarray(rng.integers(0, 50, size=(300, 5)).astype(np.float64))
  mask, values = _top_k_mask(x, 120, axis=0)                         # the radix kernel
  np.testing.assert_array_equal(np.asarray(mask), brute_mask(x, 120, 0))
  np.testing.assert_array_equal(np.asarray(values), -np.sort(-np.asarray(x), axis=0)[:120])
  vals, idx = _top_k(x, 120, axis=0)
  np.testing.assert_array_equal(np.take_along_axis(np.asarray(x), np.asarray(idx), 0), vals)


def test_compile_does_not_unroll_k():
  """The radix kernel's program is the same size whatever k is."""
  x = np.zeros((3000, 4))                                              # float64 (x64)
  sizes = [jax.jit(lambda x: selection.threshold_top_k_mask(x, k, 0)).lower(x).as_text()
           .count("\n") for k in (100, 2900)]
  assert sizes[0] == sizes[1]


@pytest.mark.parametrize("formulation", ["semi_dual", "dual"])
def test_large_k_solve_objective_equals_the_passes_kernels(formulation, monkeypatch):
  """A binding k at the MNIST clustering's ratio k/m = 1.15 / n, solved with the
  radix kernel: at its potentials after 300 iterations (columns binding, on
  the kink: a column's k-th and (k+1)-th values 4e-11 apart, closer than after
  2000) and at a perturbation of them, the objective and the plan are those of the
  k-pass kernel (forced by a huge crossover), to rounding.

  (This test once compared two whole solves. jit's cache does not see the
  patched tables, so the second solve reran the first one's radix program and
  the two agreed exactly. With the kernels really switched they do not: both
  stop on the kink after 1239-2000 iterations, 5e-7 apart in value, their
  plans up to 1.4e-3 apart, a path-dependent stop; the objectives at a given
  point agree.)"""
  m, n = 400, 10
  k = int(np.ceil(1.15 * m / n))                                     # 46
  a, b, C = problem(m, n, seed=3)
  reg = ot.SparsityConstrained(k=k, gamma=2.0)
  force_kernel(monkeypatch, "radix")
  assert selection.uses_radix(k, m, jnp.float64)
  # The kernel is picked when the solver is traced: a program cached with
  # the default one (the passes, at this k) must not be reused.
  solvers._solve_program.clear_cache()
  radix = ot.solve(a, b, C, reg, formulation=formulation, tol=1e-9, max_iter=300)
  solvers._solve_program.clear_cache()
  nnz = (np.asarray(radix.plan) > 0).sum(0)
  assert nnz.max() == k                                              # binding
  x = np.asarray(radix.alpha) if formulation == "semi_dual" else np.concatenate(
      [np.asarray(radix.alpha), np.asarray(radix.beta)])
  noise = 1e-3 * np.random.default_rng(0).standard_normal((2,) + x.shape)
  points = np.concatenate([x[None], x + noise])

  def objective():
    """Value and plan at `points`, traced now (with the current kernel)."""
    def one(x):
      if formulation == "semi_dual":
        value, _, T = objectives.semi_dual_value_and_grad(x, a, b, C, reg)
      else:
        value, _, T = objectives.dual_value_and_grad(x[:m], x[m:], a, b, C, reg)
      return value, T
    return jax.jit(jax.vmap(one))(jnp.asarray(points))     # a new function: a new trace

  with_radix = objective()
  force_kernel(monkeypatch, "passes")
  assert not selection.uses_radix(k, m, jnp.float64)
  with_passes = objective()
  np.testing.assert_allclose(np.asarray(with_radix[0]), np.asarray(with_passes[0]), rtol=1e-12)
  T_radix, T_passes = np.asarray(with_radix[1]), np.asarray(with_passes[1])
  # Perturbed points: the same plans.
  np.testing.assert_allclose(T_radix[1:], T_passes[1:], atol=1e-12)
  # The solve's point, on the kink: rows tie at a column's k-th entry to
  # rounding (measured: one pair, 2e-16 apart), and which of them is kept
  # depends on the program's rounding; each column's entries are the same.
  np.testing.assert_allclose(np.sort(T_radix[0], axis=0), np.sort(T_passes[0], axis=0),
                             atol=1e-12)
  assert ((T_passes > 0).sum(1) == k).any(axis=1).all()              # binding at each point


def test_mnist_clustering_size_solves():
  """m = 50000, n = 10, k = 5750 at a test-sized budget: compiles once, runs."""
  m, n = 50000, 10
  k = int(np.ceil(1.15 * m / n))
  rng = np.random.default_rng(4)
  C = jnp.asarray(rng.random((m, n)), jnp.float32)
  # (Built in numpy: jnp.full compiles a program per call.)
  a = jnp.asarray(np.full((m,), 1 / m, np.float32))
  b = jnp.asarray(np.full((n,), 1 / n, np.float32))
  assert selection.uses_radix(k, m, jnp.float32)
  # gamma large enough for k to bind (the L2 plan would spread wider).
  res = ot.solve(a, b, C, ot.SparsityConstrained(k=k, gamma=1e4), max_iter=20, tol=0.0,
                 trace=True)
  nnz = (np.asarray(res.plan) > 0).sum(0)
  assert (nnz <= k).all() and nnz.max() == k
  np.testing.assert_allclose(np.asarray(res.plan).sum(0), np.asarray(b), rtol=1e-4)
  # Ascent, up to the approximate Armijo test's tolerance: near the optimum a
  # step is taken on its slopes when the value change is within the rounding
  # of the value (float32 here), so the value may dip by that much.
  value = np.asarray(res.trace.value, np.float64)
  noise = optim._F_NOISE * np.finfo(np.float32).eps * np.abs(value[:-1])
  assert (np.diff(value) >= -noise).all()
  assert value[-1] > value[0]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_early_exit_mixes_separated_near_tied_and_tied_columns(dtype):
  """The early exit stops each column's count at k as soon as its k-th and
  (k+1)-th keys differ in a counted bit; columns that need the last bit (values
  one ulp apart, below the high 32-bit word for float64) or that tie at the k-th
  value still get the exact set."""
  rng = np.random.default_rng(3)
  m, k = 40, 6
  x = rng.standard_normal((m, 4)).astype(dtype)
  one = dtype(1.0)
  x[:, 0] = np.linspace(-2.0, 0.5, m)                         # well separated
  x[k - 1, 1], x[k, 1] = one, np.nextafter(one, dtype(0.0))   # k-th / (k+1)-th one ulp apart
  x[:k - 1, 1] = 5.0
  x[[5, 9, 17], 2] = 4.0                                       # a tie straddling the k-th place
  x[:k - 2, 2] = np.arange(10.0, 10.0 + k - 2)
  x[:, 3] = 2.0                                                # all tied
  xj = jnp.asarray(x)
  got = np.asarray(_sel(xj, k, 0))
  np.testing.assert_array_equal(got, brute_mask(x, k, 0))
  np.testing.assert_array_equal(got, lax_mask(xj, k, 0))
  keys = _order_keys(xj)
  t, count = _select_key(keys, k, 0, early_exit=True)
  kth = _kth_largest_key(keys, k, 0)
  assert np.all(np.asarray(t) <= np.asarray(kth))              # a lower bound ...
  exact = np.asarray(count)[0] == k                            # ... exact where count = k
  np.testing.assert_array_equal(exact, [True, True, False, False])
  np.testing.assert_array_equal((np.asarray(keys) >= np.asarray(t))[:, exact], got[:, exact])


@pytest.mark.parametrize("m", [2, 64, 65])
def test_ties_go_to_the_lowest_indices_at_any_length(m):
  """The tie path selects among the tied entries by their indices (a radix
  selection on ceil(log2 m) bits): lengths at and just above powers of two,
  an odd and an even number of index bits (1, 6, 7: whole and partial base-4
  digits), both axes (binary and base-4 digits), k from 1 to m."""
  rng = np.random.default_rng(m)
  x = rng.integers(0, 3, size=(m, 5)).astype(np.float64)      # three values: ties at every k
  x[:, 4] = 1.0                                               # one column all tied
  xj, xj_t = jnp.asarray(x), jnp.asarray(x.T)
  for k in sorted({1, 2, m // 2 + 1, m - 1, m} - {0}):
    want = brute_mask(x, k, 0)
    np.testing.assert_array_equal(np.asarray(_sel(xj, k, 0)), want, err_msg=f"k={k}")
    np.testing.assert_array_equal(np.asarray(_sel(xj_t, k, 1)), want.T, err_msg=f"k={k}")


def test_vmapped_large_k_solves_with_binding_columns_equal_single_solves():
  """The binding rows are selected one at a time in a loop whose trip count is
  their number: under vmap each problem has its own count (the loop runs to the
  largest), and every plan must still be its own solve's. Mass 1 per column on
  2000 rows makes the plain simplex supports exceed k = 40, so k binds."""
  rng = np.random.default_rng(0)
  Cs_np = rng.random((3, 2000, 8))
  Cs = jnp.asarray(Cs_np)
  # (Built in numpy: jnp.full, jnp.ones and indexing compile a program each.)
  a, b = jnp.asarray(np.full(2000, 8 / 2000)), jnp.asarray(np.ones(8))
  reg = ot.SparsityConstrained(k=40, gamma=0.1)
  assert ot.uses_radix(40, 2000, jnp.float64, minor_axis=True)
  # From alpha = 0: the default start (a log-sum-exp of C) rounds differently
  # under vmap, and 50 iterations across kinks amplify that to other supports.
  zero = jnp.asarray(np.zeros(2000))
  batched = jax.vmap(lambda C: ot.solve(a, b, C, reg, max_iter=50, tol=0.0, init=zero).plan)(Cs)
  for i in range(3):
    single = np.asarray(ot.solve(a, b, jnp.asarray(Cs_np[i]), reg, max_iter=50, tol=0.0,
                                 init=zero).plan)
    assert (np.count_nonzero(single, axis=0) == 40).all()          # k binds everywhere
    np.testing.assert_allclose(np.asarray(batched[i]), single, atol=1e-12)


def test_top_k_mask_matches_lax_top_k_with_ties_and_batches():
  x = jnp.asarray([[3.0, 1.0, 3.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0, 1.0]])
  mask, vals = _top_k_mask(x, 2, axis=-1)
  np.testing.assert_array_equal(np.asarray(mask), [[1, 0, 1, 0, 0], [1, 0, 0, 0, 1]])
  np.testing.assert_array_equal(np.asarray(vals), [[3, 3], [1, 0]])
  rng = np.random.RandomState(2)
  x_np = rng.randint(0, 4, size=(3, 4, 9)).astype(np.float64)
  x = jnp.asarray(x_np)
  for k in (1, 3, 9):
    mask, vals = _top_k_mask(x, k, axis=-1)
    v_ref, i_ref = _lax_top_k(x, k)
    ref = np.zeros(x.shape, bool)
    np.put_along_axis(ref, np.asarray(i_ref), True, axis=-1)
    np.testing.assert_array_equal(np.asarray(mask), ref)
    np.testing.assert_array_equal(np.asarray(vals), np.asarray(v_ref))
  # axis=0 on a matrix equals the transposed axis=-1.
  m0, _ = _top_k_mask(jnp.asarray(x_np[0]), 2, axis=0)
  m1, _ = _top_k_mask(jnp.asarray(x_np[0].T), 2, axis=-1)
  np.testing.assert_array_equal(np.asarray(m0), np.asarray(m1).T)


def _check_top_k_against_lax(x):
  for k in (1, 3, x.shape[-1]):
    vals, idx = _top_k(x, k, axis=-1)
    v_ref, i_ref = _lax_top_k(x, k)
    np.testing.assert_array_equal(np.asarray(idx), np.asarray(i_ref))
    np.testing.assert_array_equal(np.asarray(vals), np.asarray(v_ref))
    assert vals.dtype == x.dtype and idx.dtype == jnp.int32
  # axis=0 on a matrix equals the transposed axis=-1.
  x0 = np.asarray(x)[0]
  v0, i0 = _top_k(jnp.asarray(x0), 2, axis=0)
  v1, i1 = _top_k(jnp.asarray(x0.T), 2, axis=-1)
  np.testing.assert_array_equal(np.asarray(i0), np.asarray(i1).T)
  np.testing.assert_array_equal(np.asarray(v0), np.asarray(v1).T)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_top_k_values_and_indices_match_lax_top_k_with_ties(dtype):
  """Packed 64-bit keys (x64 on): float64 and float32 inputs."""
  rng = np.random.RandomState(2)
  _check_top_k_against_lax(jnp.asarray(rng.randint(0, 4, size=(3, 4, 9)).astype(dtype)))
  # Exact values are read back even where float64 keys round them (m = 1000:
  # 10 index bits replace mantissa bits), and distinct values stay in order.
  x = jnp.asarray(rng.randn(2, 1000).astype(dtype))
  vals, idx = _top_k(x, 7, axis=-1)
  v_ref, i_ref = _lax_top_k(x, 7)
  np.testing.assert_array_equal(np.asarray(vals), np.asarray(v_ref))
  np.testing.assert_array_equal(np.asarray(idx), np.asarray(i_ref))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("m", [161, 1000, 1003])
def test_blocked_top_k_matches_lax_top_k(dtype, m):
  """Long slices take the blocked passes (block maxima, recursively, then the
  k best blocks): many ties, the top entries crowded into one block or spread
  one per block, a length that is not a multiple of the block, both axes."""
  rng = np.random.RandomState(m)
  ties = rng.randint(0, 4, size=(2, m))                          # ties at every k
  crowded = np.zeros(m)
  crowded[m // 2: m // 2 + 8] = np.arange(8, 0, -1)              # top 8 in two blocks
  spread = rng.randn(m)
  spread[::selection._BLOCK] += 10.0                           # one large entry per block
  x_np = np.stack([*ties, crowded, spread, -np.abs(spread)]).astype(dtype)
  x, x_t = jnp.asarray(x_np), jnp.asarray(x_np.T)
  for k in (1, 2, 5):
    assert m >= selection._BLOCK_MIN_ROWS_PER_K * k * selection._BLOCK  # blocked
    vals, idx = _top_k(x, k, axis=-1)
    v_ref, i_ref = _lax_top_k(x, k)
    np.testing.assert_array_equal(np.asarray(idx), np.asarray(i_ref), err_msg=f"k={k}")
    np.testing.assert_array_equal(np.asarray(vals), np.asarray(v_ref), err_msg=f"k={k}")
    mask, _ = _top_k_mask(x_t, k, axis=0)
    ref = np.zeros(x.shape, bool)
    np.put_along_axis(ref, np.asarray(i_ref), True, axis=-1)
    np.testing.assert_array_equal(np.asarray(mask), ref.T, err_msg=f"k={k}")


@pytest.mark.float32
def test_top_k_without_x64_matches_lax_top_k_with_ties():
  """Two reductions per entry (no 64-bit keys)."""
  rng = np.random.RandomState(2)
  _check_top_k_against_lax(jnp.asarray(rng.randint(0, 4, size=(3, 4, 9)).astype(np.float32)))


def test_densify_places_values_at_indices():
  vals = jnp.asarray([[1.5, -2.0], [0.0, 4.0]])          # k = 2 along axis 0, n = 2
  idx = jnp.asarray([[3, 0], [1, 2]], jnp.int32)
  out = densify(vals, idx, 5, axis=0)
  expect = np.zeros((5, 2))
  expect[3, 0], expect[1, 0], expect[0, 1], expect[2, 1] = 1.5, 0.0, -2.0, 4.0
  np.testing.assert_array_equal(np.asarray(out), expect)
