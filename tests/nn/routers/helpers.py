"""Small hand-made routing problems and numpy references shared by the router tests.

Inputs are numpy arrays: a jnp array made from a list or numpy array compiles a
conversion program per shape.
"""
import numpy as np

from vmoe_sparse_ot.nn import routers

ALL = np.ones((1, 4), bool)
# S=4 tokens, E=3 experts.
LOGITS = np.array([[[3.0, 1.0, 0.0],
                    [0.0, 2.0, 1.5],
                    [1.0, 0.0, 2.0],
                    [2.5, 0.5, 2.0]]], np.float32)


def cfg(name, **options):
  """The router `name` with `options` (its options dataclass's keyword arguments)."""
  return routers.RouterConfig(name, routers.ROUTERS[name].options(**options))


def slots(r, g=0):
  """{expert: sorted tokens} of group g."""
  ti, va = np.asarray(r.token_index)[g], np.asarray(r.valid)[g]   # numpy: no compile
  return {e: sorted(ti[e][va[e]].tolist()) for e in range(ti.shape[0])}


def softmax(x, axis=-1):
  x = np.exp(x - x.max(axis, keepdims=True))
  return x / x.sum(axis, keepdims=True)


def cv2(x):
  """CV^2 over the last axis, population variance (V-MoE)."""
  return x.var(-1) / x.mean(-1) ** 2


def numpy_sinkhorn(logits, eps, iters, experts_first=True, mask=None):
  """Scaling-form Sinkhorn on K = exp(logits/eps) (S, E), in float64: mass 1 per real
  token (mask (S,), None: all real), n_real / E per expert; OTT's order (the expert
  scaling first) or the other."""
  s, e = logits.shape
  kernel = np.exp(logits.astype(np.float64) / eps)
  a = np.ones(s) if mask is None else mask.astype(np.float64)
  b = np.full(e, a.sum() / e)
  u, v = np.ones(s), np.ones(e)
  for _ in range(iters):
    if experts_first:
      v = b / (kernel.T @ u)
      u = a / (kernel @ v)
    else:
      u = a / (kernel @ v)
      v = b / (kernel.T @ u)
  return u[:, None] * kernel * v[None, :]
