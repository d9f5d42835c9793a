"""The FSDP2 GRPO trainer (the policy's training role), apart from the inference engines.

File map:
  train_batch.py         the train-batch contract (what a runtime hands a training step)
  trainer.py             `Trainer`: the driver side, ranks in their own processes (or in this one)
  trainer_worker.py      `TrainerWorker`: one rank (sharded policy, AdamW, the GRPO step, offload)
  trainer_checkpoint.py  checkpoints (Hugging Face folder + sharded state + RNG), written in the
                         background; complete only once `trainer_state.json` is written
  model_init.py          building the sharded policy (meta-device init, rank-0 broadcast load)
  logprobs.py            response log-probs / entropy of a batch, chunked (no [B, L, V] float32 logits)
  batching.py            micro-batches by count or by padded tokens (dynamic batch size)
  offload.py             offload/reload of device storages via reused (pinned) host buffers; CUDA flush
  memory.py              peak training memory per rank by arithmetic; check_fits (pure Python)
  dist.py                process groups and devices of the ranks, and the processes they start in
  state_store.py         the whole state in host memory (a GPS model) any world size reads (elastic training)
  row_write.py           the collective GPS row write the publish and the state store share

Publishing the policy into GPS is `pivotrl.engines.weight_sync.publish_shards` (each rank's own
shard, no gather). Importing this package imports nothing heavy; the modules import torch.
"""
