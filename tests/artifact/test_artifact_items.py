"""Every artifact item runs in its --quick variant on small data and writes its CSV and PNG."""
from __future__ import annotations

import csv
import importlib

import pytest

ITEMS = {
    "fig9": ["models", "deploy", "sim_table4_tokens_per_s", "paper_tokens_per_s", "ratio_sim_over_paper",
             "sim_best_swept_tokens_per_s", "pivot_over_this_table4", "pivot_over_this_best_swept",
             "ideal_efficiency"],
    "fig11": ["models", "variant", "throughput_tokens_per_s", "sim_over_disaggregated", "paper_over_disaggregated",
              "ratio_sim_over_paper"],
    "fig14": ["horizon_s", "throughput_tokens_per_s", "shifts_per_step"],
    "table2": ["scenario", "devices", "total_ms_median", "dp_ms", "evaluate_ms"],
}


@pytest.mark.parametrize("item", sorted(ITEMS))
def test_quick_item_writes_csv_and_png(item, tmp_path):
    mod = importlib.import_module(f"artifact.{item}.run")
    assert mod.main(["--quick", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader((tmp_path / f"{item}.csv").open()))
    assert rows, f"{item}.csv is empty"
    for col in ITEMS[item]:
        assert col in rows[0], f"{item}.csv lacks {col}"
    for r in rows:
        if "throughput_tokens_per_s" in r:
            assert float(r["throughput_tokens_per_s"]) > 0
    from tests.artifact.plotted import shows, values

    png = tmp_path / f"{item}.png"
    assert values(png), f"{item}.png draws nothing"
    thr = [float(r["throughput_tokens_per_s"]) for r in rows if r.get("throughput_tokens_per_s")]
    if thr:  # the figure draws the CSV's throughput figures, not some other numbers
        assert any(shows(png, [t]) for t in thr), f"{item}.png shows none of the CSV's throughputs"
    # re-plot from the CSV alone (what a reader does after a long run)
    (tmp_path / f"{item}.png").unlink()
    assert mod.main(["--plot-only", "--out", str(tmp_path)]) == 0
    assert (tmp_path / f"{item}.png").exists()


def test_fig9_speedup_column_is_pivot_over_mode(tmp_path):
    mod = importlib.import_module("artifact.fig9.run")
    mod.main(["--quick", "--out", str(tmp_path)])
    rows = {r["deploy"]: r for r in csv.DictReader((tmp_path / "fig9.csv").open())}
    piv = float(rows["pivot"]["sim_best_swept_tokens_per_s"])
    for mode, r in rows.items():
        assert float(r["pivot_over_this_best_swept"]) == pytest.approx(piv / float(r["sim_best_swept_tokens_per_s"]),
                                                                    rel=1e-3)
        assert float(r["paper_tokens_per_s"]) > 0 and float(r["ratio_sim_over_paper"] or 1) > 0


def test_fig9_reads_the_table4_column_from_the_sweep(monkeypatch, tmp_path):
    # the column used to be read from the summary's top level and was always empty
    mod = importlib.import_module("artifact.fig9.run")
    fake = {"colocated": (30000, {}), "pivot": (60000, {"train_home": 16}),
            "disaggregated": (45000, {"allocation": "4/24/4", "paper_allocation": "8/8/16",
                                      "paper_allocation_throughput": 40000.0}),
            "rr_colocated": (20000, {"allocation": "24/0/8", "paper_allocation": "16/0/16",
                                     "paper_allocation_throughput": 15000.0})}

    def run_one(overrides, run_dir):
        mode = next(o.split("=")[1] for o in overrides if o.startswith("deploy="))
        thr, info = fake[mode]
        return {"throughput_tokens_per_s": thr, "allocation_choice": info, "ideal_efficiency": 0.5, "num_shifts": 0}

    monkeypatch.setattr(mod, "run_one", run_one)
    rows = {r["deploy"]: r for r in mod.collect(tmp_path, quick=True)}
    d = rows["disaggregated"]
    assert d["sim_table4_tokens_per_s"] == 40000 and d["sim_best_swept_tokens_per_s"] == 45000
    assert d["paper_tokens_per_s"] == 31176 and d["ratio_sim_over_paper"] == pytest.approx(40000 / 31176, abs=1e-3)
    assert d["pivot_over_this_table4"] == 1.5 and d["pivot_over_this_best_swept"] == pytest.approx(60000 / 45000, abs=1e-3)
    assert d["paper_pivot_over_this"] == pytest.approx(50077 / 31176, abs=1e-3)
    assert rows["rr_colocated"]["table4_allocation"] == "16/0/16"


def test_default_sim_run_and_artifact_run_agree_for_the_same_settings(tmp_path):
    # issue 11: the 30-step default and the 7-step artifact differed; with the same settings the
    # two entry points give the same figure (the difference is the step count: BENCHMARKS.md)
    import json

    from artifact.common import run_one
    from pivotrl.config import compose_config
    from pivotrl.run import run

    same = ["models=qwen1.5b_glm9b", "deploy=disaggregated", "cluster.num_devices=8", "train.prompts_per_step=32",
            "train.steps=4", "train.warmup_steps=1", "deploy.allocation.rollout=2", "deploy.allocation.reward=2",
            "deploy.allocation.train=4"]
    art = run_one(["experiment=quick", *same], tmp_path / "artifact")
    cfg = compose_config(["cluster=sim", *same, "logging.wandb_mode=disabled", "logging.progress=false"])
    run(cfg, tmp_path / "default")
    default = json.loads((tmp_path / "default" / "summary.json").read_text())
    assert default["throughput_tokens_per_s"] == pytest.approx(art["throughput_tokens_per_s"], rel=1e-9)
