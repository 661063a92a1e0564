"""vmoe_sparse_ot: V-MoE with pluggable routers and a sparsity-constrained OT library."""

__version__ = "0.1.0"
