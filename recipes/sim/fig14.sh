#!/usr/bin/env bash
# Simulated fig14 (see conf/experiment/fig14.yaml). Run from the repository root.
set -euo pipefail
exec python train.py -m experiment=fig14 "$@"
