#!/usr/bin/env bash
# Simulated quick (see conf/experiment/quick.yaml). Run from the repository root.
set -euo pipefail
exec python train.py -m experiment=quick "$@"
