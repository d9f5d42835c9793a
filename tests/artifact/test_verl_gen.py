"""`artifact.calibrate.verl_gen`: verl's measured batch through the simulator's engine."""
from __future__ import annotations

import json

from artifact.calibrate import verl_gen


def test_generation_time_is_bounded_by_the_tail_and_shrinks_with_more_engines():
    from pivotrl.config import compose_config
    from pivotrl.sim.timemodel import decode_model

    cfg = compose_config(["cluster=sim", "models=qwen7b_qwen30b"])
    few, many = (verl_gen.gen_seconds(cfg, g, mean=1000.0, sigma=1.0) for g in (32, 128))
    assert few["mean_len"] > 800 and few["max_len"] <= verl_gen.MAX_RESPONSE
    model = decode_model(cfg.models.policy, cfg.cluster.hardware, tp=verl_gen.TP)
    tail = few["max_len"] * model.iter_time(1, 0)  # the longest response alone, one token per iteration
    assert many["gen_s"] >= tail * 0.99  # no engine count beats the longest response
    assert few["gen_s"] >= many["gen_s"]  # a quarter of the engines is never faster


def test_main_writes_every_point(tmp_path):
    out = tmp_path / "verl_gen.json"
    assert verl_gen.main(["--quick", "--gpus", "32", "128", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert {int(k): v for k, v in data["measured"].items()} == verl_gen.MEASURED
    (row,) = data["rows"]
    assert set(row["gen_s"]) == {"32", "128"} and row["ratio_32_128"] >= 1.0
