"""`repack_cpu_moe` imports vLLM's CPU-MoE module only on the CPU build: off it (CUDA) nothing is
imported, so a build that lacks the module still loads weights; on the CPU build it repacks each
CPU MoE layer, and a missing module there is an error naming it."""
from __future__ import annotations

import sys
import types

import pytest

pytest.importorskip("vllm")
from vllm.platforms import current_platform  # noqa: E402

from pivotrl.models import vllm_reload  # noqa: E402
from pivotrl.models.vllm_reload import CPU_MOE_MODULE, repack_cpu_moe  # noqa: E402


class _Experts:
    def __init__(self):
        self.repacked = []

    def process_weights_after_loading(self, module):
        self.repacked.append(module)


class _Model:
    """`model.modules()` with one MoE layer whose kernel holds `experts`, and one dense layer."""

    def __init__(self, experts):
        moe = types.SimpleNamespace(quant_method=types.SimpleNamespace(
            moe_kernel=types.SimpleNamespace(fused_experts=experts)))
        self._mods = [moe, types.SimpleNamespace(quant_method=None)]

    def modules(self):
        return iter(self._mods)


@pytest.fixture
def fake_cpu_moe(monkeypatch):
    """vLLM's CPU-MoE module replaced by one whose expert class is `_Experts`."""
    mod = types.ModuleType(CPU_MOE_MODULE)
    mod.CPUUnquantizedExperts = _Experts
    monkeypatch.setitem(sys.modules, CPU_MOE_MODULE, mod)
    return mod


def test_off_the_cpu_build_nothing_is_imported_and_a_load_goes_on(monkeypatch):
    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    monkeypatch.setitem(sys.modules, CPU_MOE_MODULE, None)  # `import` of it now raises ImportError
    experts = _Experts()
    assert repack_cpu_moe(_Model(experts)) == 0
    assert experts.repacked == []


def test_on_the_cpu_build_every_cpu_moe_layer_is_repacked(monkeypatch, fake_cpu_moe):
    monkeypatch.setattr(current_platform, "is_cpu", lambda: True)
    experts = _Experts()
    model = _Model(experts)
    assert repack_cpu_moe(model) == 1
    assert experts.repacked == [model._mods[0]]


def test_on_the_cpu_build_a_missing_module_is_an_error_naming_it(monkeypatch):
    monkeypatch.setattr(current_platform, "is_cpu", lambda: True)
    monkeypatch.setitem(sys.modules, CPU_MOE_MODULE, None)
    with pytest.raises(ImportError, match=CPU_MOE_MODULE.replace(".", r"\.")):
        repack_cpu_moe(_Model(_Experts()))


def test_the_platform_check_is_vllms_own():
    assert vllm_reload._on_cpu_platform() is bool(current_platform.is_cpu())
