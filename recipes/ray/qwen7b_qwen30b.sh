#!/usr/bin/env bash
# On a Ray cluster of 32 GPUs (4 nodes x 8): pivot with Qwen2.5-7B policy and Qwen3-30B-A3B GenRM.
# Needs `pip install -e .[vllm]` on every node and `ray start` done; set data.* to your parquet files.
set -euo pipefail
exec python train.py cluster=ray deploy=pivot models=qwen7b_qwen30b "$@"
