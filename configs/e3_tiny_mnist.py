"""Tiny E³ (Efficient Ensembles of Experts) fine-tuned from a V-MoE workdir, embedded MNIST.

  # 1. the V-MoE to start from (the tiny V-MoE with the topk router):
  python -m vmoe_sparse_ot.main --config=configs/vmoe_tiny_mnist.py:router=topk \
      --workdir=/tmp/vmoe_topk
  # 2. E³ with M = 2 members fine-tuned from it (300 steps):
  python -m vmoe_sparse_ot.main --config=configs/e3_tiny_mnist.py:init=/tmp/vmoe_topk \
      --workdir=/tmp/e3

Arguments: `init` (a V-MoE workdir, its latest checkpoint; '' trains E³ from
scratch), `steps` (300), `members` (M, 2), `k` (experts per token and member, 1).

The model is configs/vmoe_tiny_mnist.py's (4 blocks, D=64, MoE in blocks 1 and 3
with E=8 experts, groups of S=64 tokens) with `model.ensemble_size=M`: the image's
tokens are repeated M times before block 1, and member m routes only among its
own E/M = 4 experts, K=1 each (the reference's E³ config: K=1, M=2, so a token
reaches as many experts in all as the V-MoE's K=2), with the same capacity rule
per member (C = S/M * K / (E/M), a multiple of 4). The parameters have the
V-MoE's names and shapes (member m owns experts 4m .. 4m+3 and router columns
4m .. 4m+3), so the V-MoE workdir initializes every one of them. The training
loss is the softmax cross-entropy of each member; evaluation combines the
members by the mean of their probabilities and logs each member's loss,
accuracy and ECE (docs/E3.md). The fine-tune recipe follows the reference's eee
config in shape: warmup then cosine decay from a smaller peak than pre-training.
"""
import ml_collections

from vmoe_sparse_ot import config as config_lib


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = config_lib.parse_arg(arg, init='', steps=300, members=2, k=1)
  config = config_lib.base_config()
  config.model.patch_size = (7, 7)
  config.model.encoder.moe.split_rngs = True   # As configs/vmoe_tiny_mnist.py.
  config.model.encoder.moe.router.name = 'topk'
  config.model.encoder.moe.router.num_selected_experts = args.k
  config.model.ensemble_size = args.members
  config.dataset.name = 'embedded_mnist'
  config.dataset.train_split = 'train'
  config.dataset.eval_split = 'test'
  config.dataset.image_size = 28
  config.dataset.channels = 1
  pp = 'decode(channels={channels})|resize({image_size})|value_range(-1, 1)'
  config.dataset.pp_train = config_lib.pp_template(config.dataset, pp)
  config.dataset.pp_eval = config_lib.pp_template(config.dataset, pp)
  config.initialization.path = args.init or None
  config.batch_size = 128
  config.eval_batch_size = 500
  config.train_steps = args.steps
  config.optimizer.name = 'adam'
  config.optimizer.weight_decay = 1e-4
  config.optimizer.gradient_clip_norm = 1.0
  config.schedule.name = 'warmup_cosine_decay'
  config.schedule.peak_value = 1e-3
  config.schedule.end_value = 1e-5
  config.schedule.warmup_steps = 30
  config.checkpoint.every_steps = 100
  config.log_every_steps = 50
  config.eval_every_steps = 100
  config.fewshot.every_steps = 0
  config.fewshot.shots = (1, 5, 10)
  config.fewshot.seeds = (0, 1, 2)
  config.lock()
  return config
