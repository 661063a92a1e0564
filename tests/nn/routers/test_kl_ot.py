"""'kl_ot' (nn/routers/kl_ot.py): entropic OT routing, its plans against numpy's and
ot.sinkhorn's, its implicit gradients, dispatch, noise and losses."""
import dataclasses

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from vmoe_sparse_ot import ot
from vmoe_sparse_ot.nn.routers import kl_ot
from tests.nn.helpers import jit_route
from tests.nn.routers.helpers import cfg, cv2, numpy_sinkhorn, slots, softmax

S, E = 8, 4
LOGITS = np.asarray(jax.random.normal(jax.random.key(0), (2, S, E))) * 2
MASK = np.ones((2, S), bool)
W = np.asarray(jax.random.normal(jax.random.key(1), (2, S, E)))


def _plans(opts, differentiable=False):
  return np.asarray(jax.jit(lambda x: kl_ot.plans(x, MASK, opts, differentiable))(LOGITS))


@pytest.mark.parametrize("differentiable", [False, True])
def test_plan_is_the_references_sinkhorn_written_out(differentiable):
  """20 scaling-form iterations, the expert side first (OTT's kernel mode, as there)."""
  got = _plans(kl_ot.KLOTOptions(combine_weights="plan"), differentiable)
  for g in range(2):
    np.testing.assert_allclose(got[g], numpy_sinkhorn(LOGITS[g], 1.0, 20), atol=1e-6)


def test_plans_converge_to_sinkhorn_at_a_tight_tolerance():
  want = [np.asarray(ot.sinkhorn(np.ones(S, np.float32), np.full(E, S / E, np.float32),
                                 -LOGITS[g], 1.0, max_iter=5000, tol=1e-7).plan)
          for g in range(2)]
  sinkhorn = _plans(kl_ot.KLOTOptions(num_iters=400))
  lbfgs = _plans(kl_ot.KLOTOptions(solver="lbfgs", num_iters=200))
  for g in range(2):
    np.testing.assert_allclose(sinkhorn[g], want[g], atol=1e-6)
    # L-BFGS stops once max |grad| <= 1e-3 (the reference's rule, on the norm there).
    np.testing.assert_allclose(lbfgs[g], want[g], atol=1e-3)
    np.testing.assert_allclose(lbfgs[g].sum(0), S / E, rtol=1e-5)   # columns exact


def test_implicit_gradient_is_the_unrolled_one_at_convergence():
  """At convergence the derivative of the fixed point (implicit) is the limit of the
  unrolled iterations'; after the reference's 20 iterations the two differ."""
  def grad(opts):
    return np.asarray(jax.jit(jax.grad(
        lambda x: jnp.sum(kl_ot.plans(x, MASK, opts) * W)))(LOGITS))

  opts = kl_ot.KLOTOptions(num_iters=300, combine_weights="plan")
  implicit = grad(opts)
  unrolled = grad(dataclasses.replace(opts, implicit_differentiation=False))
  np.testing.assert_allclose(implicit, unrolled, atol=1e-5)
  assert np.abs(implicit).max() > 0.05
  lbfgs = grad(dataclasses.replace(opts, solver="lbfgs", num_iters=200))
  np.testing.assert_allclose(lbfgs, implicit, atol=2e-3)


def test_token_and_expert_choice_dispatch_and_combine_weights():
  tc = cfg("kl_ot", num_selected_experts=1)
  r = jit_route(LOGITS, MASK, tc, capacity=S, train=False)
  plan = _plans(tc.options)
  for g in range(2):
    want = {e: sorted(np.nonzero(plan[g].argmax(1) == e)[0].tolist()) for e in range(E)}
    assert slots(r, g) == want
  ti, va, w = (np.asarray(x) for x in (r.token_index, r.valid, r.combine_weight))
  gates = np.take_along_axis(softmax(LOGITS).transpose(0, 2, 1), ti, 2)
  np.testing.assert_allclose(w, np.where(va, gates, 0), rtol=1e-6)
  ec = cfg("kl_ot", form="expert_choice", combine_weights="plan", capacity_factor=1.0,
           capacity_multiple_of=1)
  r = jit_route(LOGITS, MASK, ec, capacity=2, train=False)
  ti, va, w = (np.asarray(x) for x in (r.token_index, r.valid, r.combine_weight))
  for g in range(2):
    for e in range(E):
      assert sorted(ti[g, e].tolist()) == sorted(np.argsort(-plan[g, :, e])[:2].tolist())
  np.testing.assert_allclose(w, np.take_along_axis(plan.transpose(0, 2, 1), ti, 2), atol=1e-6)


def test_noise_and_auxiliary_losses_in_training():
  rng = jax.random.key(3)
  opts = cfg("kl_ot", num_selected_experts=2, importance_loss_weight=0.5, load_loss_weight=2.0)
  r = jax.jit(lambda x: kl_ot.route(x, jnp.asarray(MASK), opts.options, 8, True, rng))(LOGITS)
  noisy = LOGITS + np.asarray(jax.random.normal(rng, LOGITS.shape, jnp.float32)) / E
  plan = np.stack([numpy_sinkhorn(noisy[g], 1.0, 20) for g in range(2)])
  for g in range(2):   # the plan of the noisy logits chooses
    top2 = np.argsort(-plan[g], axis=1, kind="stable")[:, :2]
    assert slots(r, g) == {e: sorted(np.nonzero((top2 == e).any(1))[0].tolist())
                           for e in range(E)}
  importance = np.mean(cv2(softmax(LOGITS).sum(1)))          # on the clean softmax
  np.testing.assert_allclose(r.metrics["importance_loss"], importance, rtol=1e-5)
  assert r.metrics["load_loss"] > 0
  np.testing.assert_allclose(r.auxiliary_loss,
                             0.5 * importance + 2.0 * r.metrics["load_loss"], rtol=1e-5)
  # Defaults: no loss, as the reference's.
  quiet = jax.jit(lambda x: kl_ot.route(x, jnp.asarray(MASK), cfg("kl_ot").options, 8, True,
                                        rng))(LOGITS)
  assert float(quiet.auxiliary_loss) == 0.0 and "load_loss" not in quiet.metrics
