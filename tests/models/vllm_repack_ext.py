"""Worker extension for tests/models/test_tiny_families_vllm.py (vLLM imports it by name in its
worker): an in-place reload followed by `repack_cpu_moe`, what the engine's extension should do."""
from __future__ import annotations


class RepackingReload:
    def reload_and_repack(self, path: str) -> int:
        from safetensors.torch import load_file

        from pivotrl.models.vllm_reload import repack_cpu_moe

        tensors = load_file(path)
        self.model_runner.reload_weights(weights_iterator=iter(tensors.items()), is_checkpoint_format=True)
        return repack_cpu_moe(self.model_runner.model)
