#!/usr/bin/env bash
# Simulated fig11 (see conf/experiment/fig11.yaml). Run from the repository root.
set -euo pipefail
exec python train.py -m experiment=fig11 "$@"
