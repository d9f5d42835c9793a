"""PivotRL: RL post-training with generative reward models that shifts devices between roles.

Start at `pivotrl.run.run(cfg)`; the package map is in the README.
"""
__version__ = "0.1.0"
