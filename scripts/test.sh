#!/usr/bin/env bash
# Install PivotRL with its test extras and run the test suite (the README's second command).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -e ".[test]"
python -m pytest -q "$@"
