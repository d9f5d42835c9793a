#!/usr/bin/env bash
# Simulated fig9 (see conf/experiment/fig9.yaml). Run from the repository root.
set -euo pipefail
exec python train.py -m experiment=fig9 "$@"
