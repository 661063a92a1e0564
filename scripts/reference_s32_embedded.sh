#!/usr/bin/env bash
# The reference V-MoE code's S/32 ILSVRC2012 recipe, its config file unchanged, on
# this project's embedded data: every override names the file's own keys (the
# datasets become embedded MNIST and scikit-learn's digits, the model narrower,
# the run one epoch of 4,096 images). docs/REFERENCE.md shows what it prints.
#
#   bash scripts/reference_s32_embedded.sh /path/to/vmoe [--workdir=DIR] [more flags]
#
# /path/to/vmoe is a checkout of the reference code: the config file imports its
# config modules. Extra arguments go to the trainer (--print_config, overrides).
set -euo pipefail
if [[ $# -lt 1 || ! -d "$1" ]]; then
  echo "usage: bash scripts/reference_s32_embedded.sh /path/to/vmoe [flags]" >&2
  exit 2
fi
VMOE="$(cd "$1" && pwd)"
shift
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup.sh
LABELS='onehot(10, inkey="label", outkey="labels")|keep("image", "labels")'
EVAL="decode|resize(32)|value_range(-1,1)|$LABELS"
variant() {  # name dataset split
  echo "--config.dataset.$1.name=$2" "--config.dataset.$1.split=$3" \
       "--config.dataset.$1.batch_size=256"
}
# shellcheck disable=SC2046
PYTHONPATH="$VMOE${PYTHONPATH:+:$PYTHONPATH}" exec .venv/bin/python -m vmoe_sparse_ot.main \
  --config="$VMOE/vmoe/configs/vmoe_paper/vmoe_s32_last2_ilsvrc2012_randaug_light1.py" \
  --workdir=/tmp/reference_s32 \
  --config.dataset.train.name=embedded_mnist --config.dataset.train.split='train[:4096]' \
  --config.dataset.train.batch_size=128 \
  --config.dataset.train.process="decode|inception_crop(32)|flip_lr|randaug(2, 10)|value_range(-1,1)|$LABELS" \
  $(variant val embedded_mnist 'validation[:512]') --config.dataset.val.process="$EVAL" \
  $(variant test embedded_mnist 'test[:1024]') --config.dataset.test.process="$EVAL" \
  $(variant imagenet_v2 sklearn_digits test) --config.dataset.imagenet_v2.process="$EVAL" \
  $(variant imagenet_real embedded_mnist 'test[1024:2048]') \
  --config.dataset.imagenet_real.process="$EVAL" \
  --config.model.num_classes=10 --config.model.patch_size='(8, 8)' \
  --config.model.hidden_size=64 --config.model.representation_size=64 \
  --config.model.encoder.mlp_dim=128 --config.model.encoder.num_heads=4 \
  --config.model.encoder.moe.group_size=136 \
  --config.num_expert_partitions=1 --config.train_epochs=1 \
  --config.optimizer.learning_rate.warmup_steps=8 \
  --config.evaluate.every_steps=16 --config.save_checkpoint.every_steps=16 \
  --config.report_progress.every_steps=4 --config.profile.first_profile=0 "$@"
