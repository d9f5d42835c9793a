"""GRPO trainer step time on the tiny policy, world size 1 and 2 (FSDP2 over gloo on CPU).

`python -m pivotrl.bench trainer [--json PATH] [--layers 4] [--steps 3]`. Reports start-up, per-step
time and the time to publish the full state dict (what goes to the GPS after each step).
"""
from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path

from pivotrl.bench.common import parser, print_table, write_json


def _batch(n: int, seed: int, version: int):
    from pivotrl.engines.trainer import TrainBatch

    rng = random.Random(seed)
    return TrainBatch(
        prompt_ids=[[rng.randrange(4, 100) for _ in range(rng.randint(16, 32))] for _ in range(n)],
        response_ids=[[rng.randrange(4, 100) for _ in range(rng.randint(8, 32))] for _ in range(n)],
        versions=[version] * n, rewards=[rng.random() for _ in range(n)], group_ids=[i // 8 for i in range(n)])


def main(argv: list[str]) -> int:
    p = parser("GRPO trainer step time (tiny policy, FSDP2/gloo)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--world-sizes", default="1,2")
    a = p.parse_args(argv)
    import torch

    from pivotrl.config.rl import TinyModelConfig
    from pivotrl.config.trainer import TrainerConfig
    from pivotrl.engines.trainer import Trainer
    from pivotrl.models.tiny import create_tiny_model

    torch.set_num_threads(1)
    model = create_tiny_model(Path(tempfile.mkdtemp()) / "policy", TinyModelConfig(num_layers=a.layers), seed=0)
    rows = []
    for ws in (int(x) for x in a.world_sizes.split(",")):
        for n, mbs in ((64, 16), (256, 64)):
            t0 = time.perf_counter()
            cfg = TrainerConfig(world_size=ws, micro_batch_size=mbs, lr=1e-4, num_threads=1, device="cpu")
            with Trainer(cfg, model) as tr:
                start = time.perf_counter() - t0
                times = []
                for s in range(a.steps):
                    t = time.perf_counter()
                    tr.step(_batch(n, s, tr.version))
                    times.append(time.perf_counter() - t)
                t = time.perf_counter()
                tr.state_dict()
                publish = time.perf_counter() - t
            rows.append({"world_size": ws, "sequences": n, "micro_batch": mbs, "start_s": start,
                         "step_s_median": statistics.median(times), "step_s_min": min(times),
                         "publish_s": publish})
    print_table(rows, "trainer step time")
    write_json(a.json, "trainer", rows)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
