"""The paper's V-MoE B/32: Every-2, E=32, K=2, groups of S=400 tokens, C=28, k=16 for sparse_ot.

Where the numbers come from (details in `config.paper_vmoe_config`):
- the paper's Appendix A.5 (V-MoE experiment): Every-2, E = 32, K = 2 for TopK and
  S-BASE, k = 16 for the sparsity-constrained router (its buffer size too),
  solved with Adam, learning rate 1e-2, 50 steps;
- V-MoE (Riquelme et al. 2021) and its released configs, which the paper
  follows: routing groups of 8 images (S = 8 x 50 tokens at 224px), capacity
  factor 1.05 (C = 28 at K = 2, E = 32), the einsum dispatcher in bfloat16, gate
  noise 1/E, importance and load loss weights 0.005; Adam with weight decay 0.1,
  10k warmup steps then linear decay, peak learning rate 8e-4 (V-MoE Table 8),
  batch 4096, ~521k steps (7 JFT-300M epochs).
JFT is private, so the dataset is a public TFDS name that must be prepared
under data_dir:

  --config=configs/vmoe_b32.py:router=sparse_ot,dataset=imagenet2012,data_dir=/data/tfds

Needs accelerators and the data; on CPU it only builds and passes a one-step dry
run with shrunken sizes (see tests/train/test_recipes.py).
"""
import ml_collections

from vmoe_sparse_ot import config as config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  return config_lib.paper_vmoe_config('B', 32, arg)
