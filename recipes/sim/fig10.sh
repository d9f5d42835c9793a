#!/usr/bin/env bash
# Simulated fig10 (see conf/experiment/fig10.yaml). Run from the repository root.
set -euo pipefail
exec python train.py -m experiment=fig10 "$@"
