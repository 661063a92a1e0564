"""sparse_ot's solvers in the router: Newton (the default) and the paper's Adam.

Newton's plans are `ot.batched_semi_dual`'s (tests/ot/test_newton.py checks them
against the optimum); here: the router reports the solver's steps, splits over a
mesh as on one device, and refuses bad options in one line.
"""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.nn import routers
from vmoe_sparse_ot.nn.routers import sparse_ot


def cfg(**options):
  return routers.RouterConfig("sparse_ot", routers.ROUTERS["sparse_ot"].options(**options))


def _logits(g, s, e, seed=0, scale=2.0):
  return (scale * np.random.default_rng(seed).standard_normal((g, s, e))).astype(np.float32)


def test_newton_is_the_default_and_its_plans_are_ot_batched_semi_dual_s():
  opts = sparse_ot.SparseOTOptions()
  assert (opts.solver, opts.num_steps) == ("newton", None)
  assert sparse_ot.num_steps(opts) == 10
  assert sparse_ot.num_steps(sparse_ot.SparseOTOptions(solver="adam")) == 50
  g, s, e, c = 3, 24, 4, 8
  logits, mask = _logits(g, s, e), np.ones((g, s), bool)
  plan = np.asarray(jax.jit(lambda x: sparse_ot.plans(x, mask, opts, c))(logits))
  cost = 1.0 - jax.nn.softmax(jnp.asarray(logits), -1)
  want = ot.batched_semi_dual(cost, jnp.ones((g, s)), jnp.full((g, e), s / e), c)
  np.testing.assert_allclose(plan, np.asarray(want.plan), atol=1e-6)


@pytest.mark.parametrize("solver,steps", [("newton", None), ("newton", 3), ("adam", 7)])
def test_router_reports_the_solver_steps(solver, steps):
  """Per layer: the mean and the max over groups of the steps, and the share of groups
  that hit the cap without meeting the stop rule. Group 1 is all padding: Newton's
  first evaluation meets the rule there (nothing to move), so it takes 1 step."""
  g, s, e, c = 2, 24, 4, 8
  mask = np.ones((g, s), bool)
  mask[1] = False
  r = jax.jit(lambda x: routers.route(x, mask, cfg(solver=solver, num_steps=steps, k=c),
                                      c, False))(_logits(g, s, e, seed=1))
  m = {k: float(v) for k, v in r.metrics.items()}
  if solver == "adam":
    assert (m["solver_steps"], m["solver_steps_max"], m["solver_unconverged"]) == (7, 7, 0)
    return
  cap = steps or 10
  res = ot.batched_semi_dual(1.0 - jax.nn.softmax(jnp.asarray(_logits(g, s, e, seed=1)), -1),
                             jnp.asarray(mask, jnp.float32),
                             jnp.repeat(mask.sum(1, keepdims=True) / e, e, 1), c, max_steps=cap)
  want = np.asarray(res.steps)
  assert want[1] == 1 and want[0] == cap                   # the cap binds on the real group
  assert m["solver_steps"] == pytest.approx(want.mean())
  assert m["solver_steps_max"] == cap
  assert m["solver_unconverged"] == pytest.approx(0.5)


@pytest.mark.parametrize("form", ["expert_choice", "token_choice"])
def test_on_eight_devices_the_router_equals_its_run_on_one(form):
  """Groups split over ('data' 4 x 'expert' 2), as the MoE layer lays them out: the
  same dispatch, combine weights and steps as on one device, with padding."""
  if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices")
  c = 6 if form == "expert_choice" else None
  config = cfg(form=form, k=c, capacity_factor=1.5)
  capacity = routers.ROUTERS["sparse_ot"].capacity(config.options, 16, 4)
  logits = _logits(8, 16, 4, seed=3)
  mask = np.arange(8 * 16).reshape(8, 16) % 16 < 13          # 3 padding tokens each
  route = jax.jit(lambda x, m: routers.route(x, m, config, capacity, False))
  want = route(logits, mask)
  mesh = jax.make_mesh((4, 2), ("data", "expert"), axis_types=(AxisType.Auto,) * 2)
  groups = NamedSharding(mesh, P(("data", "expert")))
  with jax.set_mesh(mesh):
    got = route(jax.device_put(logits, groups), jax.device_put(mask, groups))
  np.testing.assert_array_equal(np.asarray(got.token_index), np.asarray(want.token_index))
  np.testing.assert_array_equal(np.asarray(got.valid), np.asarray(want.valid))
  np.testing.assert_allclose(np.asarray(got.combine_weight), np.asarray(want.combine_weight),
                             rtol=1e-6)
  for name in ("solver_steps", "solver_steps_max", "solver_unconverged"):
    assert float(got.metrics[name]) == pytest.approx(float(want.metrics[name]))


@pytest.mark.parametrize("key,value,allowed", [
    ("solver", "newtonn", "must be one of ['newton', 'adam', 'lbfgs']"),
    ("tol", -1.0, "must be >= 0"),
    ("num_steps", 0, "must be an integer >= 1 or None"),
])
def test_a_bad_option_is_one_line_naming_the_key(key, value, allowed):
  with pytest.raises(ValueError) as err:
    routers.parse_router_options({"name": "sparse_ot", "sparse_ot": {key: value}})
  msg = str(err.value)
  assert "\n" not in msg
  assert msg.startswith(f"model.encoder.moe.router.sparse_ot.{key} ")
  assert re.escape(allowed) and allowed in msg
