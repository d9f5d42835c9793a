#!/usr/bin/env bash
# On a Ray cluster of 32 GPUs (4 nodes x 8): pivot with Qwen2.5-7B policy and Qwen3-30B-A3B GenRM.
# Needs `pip install -e .[vllm]` on every node and a running head (`ray start --head`); pass its
# address and your verl-format parquet files, e.g.
#   bash recipes/ray/qwen7b_qwen30b.sh cluster.address=HEAD:6379 data.train_path=/data/train.parquet data.val_path=/data/val.parquet
set -euo pipefail
exec python train.py cluster=ray deploy=pivot models=qwen7b_qwen30b "$@"
