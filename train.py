"""PivotRL entry point: `python train.py deploy=pivot models=qwen7b_qwen30b cluster=sim`.

Composes `conf/`, converts once into the typed `PivotConfig`, and hands it to `pivotrl.run`.
"""
import hydra
from omegaconf import DictConfig, OmegaConf

from pivotrl.config import PivotConfig, register_configs

register_configs()


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(dcfg: DictConfig) -> float | None:
    from pivotrl.run import run

    cfg: PivotConfig = OmegaConf.to_object(dcfg)  # type: ignore[assignment]
    summary = run(cfg)
    return summary.get("throughput_tokens_per_s")


if __name__ == "__main__":
    main()
