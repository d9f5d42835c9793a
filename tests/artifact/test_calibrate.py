"""The baseline calibration (artifact/calibrate): its loss matches the unordered 1.5b pair in the
better order, it never reads pivot's figure, its grid stays inside the declared ranges, and
`--write` marks every fitted line in the yaml with its residuals."""
from __future__ import annotations

import json
import math
import shutil

import pytest

from artifact.calibrate import run as cal


def test_loss_uses_the_better_order_of_an_unordered_pair():
    paper = {"colocated": [25405, 27184], "disaggregated": 31176, "rr_colocated": [27184, 25405]}
    sim = {"colocated": 27184.0, "disaggregated": 31176.0, "rr_colocated": 25405.0}
    loss, matched = cal.group_loss(sim, paper)
    assert loss == pytest.approx(0.0) and matched["colocated"] == 27184
    loss2, _ = cal.group_loss({**sim, "disaggregated": 2 * 31176.0}, paper)
    assert loss2 == pytest.approx(math.log(2) ** 2)


def test_pivot_is_held_out_and_grids_stay_in_range():
    paper = cal.paper_baselines()
    assert all(set(d) == set(cal.BASELINES) for d in paper.values())  # no pivot value is read
    assert set(paper) == set(cal.GROUPS)
    for c in cal.CONSTANTS:
        assert all(c.lo <= v <= c.hi for v in c.grid) and c.lo <= c.start <= c.hi
        assert c.key.startswith(("cluster.hardware.", "models.")) and "pivot" not in c.key


def test_write_marks_fitted_lines(monkeypatch, tmp_path):
    root = tmp_path
    for sub in ("conf/models", "conf/cluster"):
        (root / sub).mkdir(parents=True)
    for g in cal.GROUPS:
        shutil.copy(cal.ROOT / "conf" / "models" / f"{g}.yaml", root / "conf" / "models" / f"{g}.yaml")
    shutil.copy(cal.ROOT / "conf" / "cluster" / "sim.yaml", root / "conf" / "cluster" / "sim.yaml")
    monkeypatch.setattr(cal, "ROOT", root)
    fit = cal.Fitter.__new__(cal.Fitter)
    fit.groups = list(cal.GROUPS)
    fit.params = {"mfu": {"H20": 0.28}, "eager_layer_s": {"H20": 0.3e-3},
                  "genrm_median": {v: 3500.0 for v in cal.GENRM_OF.values()}, "genrm_sigma": {"all judges": 1.2},
                  "step_offset": {g: 150.0 for g in cal.GROUPS}}
    rows = [{"models": g, "deploy": m, "ratio": 1.1} for g in cal.GROUPS for m in cal.BASELINES]
    cal.write_yaml(fit, rows)
    for g in cal.GROUPS:
        text = (root / "conf" / "models" / f"{g}.yaml").read_text()
        assert "genrm: {median: 3500, sigma: 1.2, max_len: 20480}   # E, fitted to Fig. 9 baselines" in text
        assert "step_offset: 150   # E, fitted to Fig. 9 baselines" in text and "disaggregated x1.10" in text
    hw = (root / "conf" / "cluster" / "sim.yaml").read_text()
    assert "mfu: 0.28   # E, fitted to Fig. 9 baselines" in hw
    assert "eager_layer_s: 0.3e-3   # E, fitted to Fig. 9 baselines" in hw
    assert "flops_dense: 30.0e+12   # M-derived: verl's measured" in hw  # set from verl_gen, never fitted
    assert "flops_moe: 40.0e+12     # D: the per-sequence decode work" in hw  # calibration §7 V4, never fitted
    assert "bw_experts: 3.0e12" in hw and "Not fitted" in hw
    cal.write_yaml(fit, rows)  # idempotent: a second fit rewrites the same lines
    assert (root / "conf" / "cluster" / "sim.yaml").read_text().count("mfu:") == 1


def test_implied_mfu_grows_with_the_throughput_it_must_explain():
    from artifact.calibrate.bounds import implied_mfu

    lo, hi = implied_mfu("qwen7b_qwen30b", 11_711), implied_mfu("qwen7b_qwen30b", 22_822)
    assert lo["tokens_per_step"] == hi["tokens_per_step"] > lo["policy_tokens_per_step"] > 0
    assert lo["train_devices"] == 8  # Table 4's training home set
    assert 0 < lo["min_mfu"] < hi["min_mfu"]
    assert hi["step_s_at_paper"] == pytest.approx(hi["tokens_per_step"] / 22_822)


def test_cache_key_changes_with_the_model_not_with_the_fitted_values(monkeypatch, tmp_path):
    g = "qwen7b_qwen30b"
    fit = cal.Fitter(tmp_path, 1, [g])
    base = fit.model_key(g, "rr_colocated")
    assert base != fit.model_key(g, "disaggregated")  # one key per mode
    fit.params["mfu"]["H20"] = 0.41  # a fitted value is in the point, not in the model key
    assert cal.Fitter(tmp_path, 1, [g]).model_key(g, "rr_colocated") == base
    real = cal.overrides
    monkeypatch.setattr(cal, "overrides", lambda *a: [*real(*a), "models.sim.phase_switch=shift"])
    assert cal.Fitter(tmp_path, 1, [g]).model_key(g, "rr_colocated") != base  # a changed model


def test_point_reports_sim_against_the_paper_with_stage_seconds():
    from artifact.calibrate.points import point

    r = point("qwen7b_qwen30b", "disaggregated", ["train.steps=3"])
    assert r["paper_tokens_per_s"] == 11_711
    assert r["ratio"] == [round(r["sim_tokens_per_s"] / 11_711, 3)]
    assert r["paper_step_s"] == [round(r["tokens_per_step"] / 11_711, 1)]
    assert 0 < r["rollout_s"] < r["step_s"] and r["train_s"] > 0
    faster = point("qwen7b_qwen30b", "disaggregated", ["train.steps=3", "cluster.hardware.mfu=0.41"])
    assert faster["train_s"] < r["train_s"]  # the override reaches the run


def test_a_trial_grid_leaves_the_declared_range_and_is_never_written(monkeypatch, tmp_path):
    monkeypatch.setattr(cal, "CONSTANTS", list(cal.CONSTANTS))
    monkeypatch.setattr(cal, "BY_NAME", dict(cal.BY_NAME))
    c = cal.trial_constant("flops_moe=25e12,6e12,13e12")
    assert (c.lo, c.hi, c.grid) == (6e12, 25e12, (6e12, 13e12, 25e12)) and c.lo <= c.start <= c.hi
    assert c.key == "cluster.hardware.flops_moe" and c.scope == "hardware"
    for bad in ("nope=1,2", "flops_moe=", "flops_moe=a,b"):
        with pytest.raises(ValueError, match="NAME=V1,V2"):
            cal.trial_constant(bad)
    with pytest.raises(SystemExit):  # refused before anything runs or is written
        cal.main(["--trial-grid", "flops_moe=6e12,25e12", "--write", "--out", str(tmp_path / "x")])
    assert not (tmp_path / "x").exists()


def test_engine_constants_measured_in_calibration_7_stay_out_of_the_fit():
    fitted = {c.key for c in cal.CONSTANTS}
    for key in ("bw_kv", "bw_experts", "bw_weights", "flops_moe", "flops_prefill", "flops_dense", "t_moe_layer"):
        assert f"cluster.hardware.{key}" not in fitted
    assert {"cluster.hardware.mfu", "cluster.hardware.eager_layer_s", "models.workload.genrm.median",
            "models.workload.genrm.sigma", "models.sim.step_offset"} == fitted
    median = cal.BY_NAME["genrm_median"]
    assert (median.lo, median.hi) == (800.0, 8000.0)  # thinking judges (calibration §7)


def test_quick_refit_runs_end_to_end(tmp_path):
    """The fit's whole path on a small batch: one group, one round, 3-point grids, results written."""
    assert cal.main(["--quick", "--jobs", "1", "--out", str(tmp_path)]) == 0
    fit = json.loads((tmp_path / "fit.json").read_text())
    assert {r["deploy"] for r in fit["rows"]} == set(cal.BASELINES) and fit["sim_runs"] > 0
    for name, (lo, hi) in fit["ranges"].items():
        assert all(lo <= v <= hi for v in fit["params"][name].values())
    with pytest.raises(SystemExit):
        cal.main(["--quick", "--write", "--out", str(tmp_path)])
