"""vmoe_sparse_ot: V-MoE with pluggable routers and a sparsity-constrained OT library.

`vmoe_sparse_ot.load(workdir, step=None, **routing_overrides)` restores a trained
checkpoint as a numpy-in, numpy-out model (`vmoe_sparse_ot.inference`);
`load(checkpoint=PREFIX_OR_NPZ, config=...)` does the same for weights without a
workdir (a released checkpoint) on the config's model. It loads
on first use (PEP 562), so `import vmoe_sparse_ot` imports neither JAX nor
TensorFlow.
"""
import importlib

__version__ = "0.1.0"

_LAZY = {"load": "vmoe_sparse_ot.inference", "LoadedModel": "vmoe_sparse_ot.inference"}


def __getattr__(name):
  if name in _LAZY:
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + list(_LAZY))
