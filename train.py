"""PivotRL entry point: `python train.py deploy=pivot models=qwen7b_qwen30b cluster=sim`.

Composes `conf/`, converts once into the typed `PivotConfig` (`pivotrl.config.load`), and hands it
to `pivotrl.run`. Renamed keys on the command line fail before Hydra composes, naming the new key.
"""
import sys

import hydra
from omegaconf import DictConfig

from pivotrl.config import PivotConfig, load, register_configs
from pivotrl.config.loader import check_overrides

register_configs()


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(dcfg: DictConfig) -> float | None:
    from pivotrl.run import run

    cfg: PivotConfig = load(dcfg)
    summary = run(cfg)
    return summary.get("throughput_tokens_per_s")


if __name__ == "__main__":
    check_overrides([a for a in sys.argv[1:] if not a.startswith("-")])
    main()
