"""The paper's V-MoE B/16: Every-2, E=32, K=2, capacity 16, k=16 for sparse_ot.

As in "Sparsity-Constrained Optimal Transport" (appendix, V-MoE experiment) on top
of V-MoE's upstream recipe: Adam with weight decay 0.1, 10k warmup steps then
linear decay, batch 4096, ~521k steps (7 JFT-300M epochs). JFT is private, so the
dataset is a public TFDS name that must be prepared under data_dir:

  --config=configs/vmoe_b16.py:router=sparse_ot,dataset=imagenet2012,data_dir=/data/tfds

Needs accelerators and the data; on CPU it only builds and passes a one-step dry
run with shrunken sizes (see tests/train/test_configs.py).
"""
import ml_collections

from vmoe_sparse_ot.train import config as config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  return config_lib.paper_vmoe_config('B', 16, arg)
