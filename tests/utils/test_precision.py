"""Tests of spectraflow_monai.utils.precision: the ``precision`` setting, its capability probes and the inferer."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn
from monai.inferers import SliceInferer

from spectraflow_monai.utils import (
    AutocastInferer,
    Precision,
    SettingError,
    amp_kwargs,
    autocast_kwargs,
    autocast_off,
    cpu_bf16_flags,
    resolve_precision,
)
from spectraflow_monai.utils import precision as precision_module

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32

# setting, device, CPU bf16 flags, GPU bf16 support -> name, dtype, autocast, grad scaler, reason (substring)
MATRIX = [
    ("auto", "cpu", ("avx512_bf16",), False, "bf16", BF16, True, False, "auto: CPU has avx512_bf16"),
    ("auto", "cpu", ("avx512_bf16", "amx_bf16"), False, "bf16", BF16, True, False, "avx512_bf16 and amx_bf16"),
    ("auto", "cpu", ("amx_bf16",), False, "bf16", BF16, True, False, "auto: CPU has amx_bf16"),
    ("auto", "cpu", (), True, "fp32", FP32, False, False, "auto: CPU has no native bfloat16"),
    ("auto", "cuda", (), True, "bf16", BF16, True, False, "auto: GPU supports bfloat16"),
    ("auto", "cuda:1", ("avx512_bf16",), False, "fp16", FP16, True, True, "auto: GPU without bfloat16"),
    ("bf16", "cpu", ("avx512_bf16",), False, "bf16", BF16, True, False, "set"),
    ("bf16", "cpu", (), False, "bf16", BF16, True, False, "emulated"),
    ("bf16", "cuda", (), True, "bf16", BF16, True, False, "set"),
    ("fp16", "cuda", (), True, "fp16", FP16, True, True, "set"),
    ("fp16", "cuda", (), False, "fp16", FP16, True, True, "set"),
    ("fp32", "cpu", ("avx512_bf16",), True, "fp32", FP32, False, False, "set"),
    ("fp32", "cuda", (), True, "fp32", FP32, False, False, "set"),
    ("FP32", "cpu", (), False, "fp32", FP32, False, False, "set"),  # case-insensitive
    ("auto", "mps", ("avx512_bf16",), True, "fp32", FP32, False, False, "auto: no reduced precision chosen on mps"),
]


@pytest.fixture
def probes(monkeypatch):
    """Set the CPU flags and the GPU bfloat16 support that resolve_precision sees."""

    def set_probes(cpu_flags: tuple[str, ...], gpu_bf16: bool, cuda: bool = True) -> None:
        monkeypatch.setattr(precision_module, "cpu_bf16_flags", lambda: tuple(cpu_flags))
        monkeypatch.setattr(precision_module, "cuda_supports_bf16", lambda device=None: gpu_bf16)
        monkeypatch.setattr(precision_module, "_cuda_available", lambda: cuda)

    return set_probes


@pytest.mark.parametrize("setting,device,flags,gpu_bf16,name,dtype,autocast,scaler,reason", MATRIX)
def test_selection_matrix(probes, setting, device, flags, gpu_bf16, name, dtype, autocast, scaler, reason):
    probes(flags, gpu_bf16)
    p = resolve_precision(setting, device, log=False)
    assert (p.name, p.dtype, p.autocast, p.use_grad_scaler) == (name, dtype, autocast, scaler)
    assert p.device_type == torch.device(device).type
    assert p.setting == setting.lower()
    assert reason in p.reason
    assert str(p) == f"{name} ({p.reason})"


@pytest.mark.parametrize("setting", ["auto", "bf16", "fp16", "fp32"])
def test_cuda_device_without_cuda(probes, setting):
    probes((), True, cuda=False)
    with pytest.raises(SettingError, match=rf"precision='{setting}'.*device 'cuda:0', but CUDA is not available"):
        resolve_precision(setting, "cuda:0")


@pytest.mark.parametrize(
    "setting,device,flags,gpu_bf16,match",
    [
        ("fp16", "cpu", ("avx512_bf16",), False, r"precision='fp16' needs a CUDA device.*got device 'cpu'"),
        ("bf16", "cuda", (), False, r"precision='bf16' but the GPU 'cuda' has no bfloat16 support"),
        ("bf16", "mps", (), True, r"precision='bf16' is supported on cpu and cuda devices, got device 'mps'"),
        ("fp16", "mps", (), True, r"precision='fp16' is supported on cpu and cuda devices"),
    ],
)
def test_setting_the_device_cannot_run(probes, setting, device, flags, gpu_bf16, match):
    probes(flags, gpu_bf16)
    with pytest.raises(SettingError, match=match):
        resolve_precision(setting, device)


@pytest.mark.parametrize("value", ["half", "bfloat16", "", "amp", None, 16, True])
def test_ill_setting_names_it(value):
    with pytest.raises(ValueError, match=r"precision must be one of auto, bf16, fp16, fp32, got " + repr(value)):
        resolve_precision(value, "cpu")


def test_ill_device_names_it():
    with pytest.raises(ValueError, match=r"device must be a torch device .*got 'gpu0'"):
        resolve_precision("auto", "gpu0")


def test_choice_is_logged(probes, caplog):
    probes(("avx512_bf16",), False)
    with caplog.at_level(logging.INFO, logger="spectraflow_monai.utils.precision"):
        resolve_precision("auto", "cpu")
    assert "precision: bf16 (auto: CPU has avx512_bf16)" in caplog.text
    caplog.clear()
    probes((), False)
    with caplog.at_level(logging.INFO, logger="spectraflow_monai.utils.precision"):
        resolve_precision("auto", "cpu")
        resolve_precision("fp32", "cpu", log=False)
    assert caplog.text.count("precision: ") == 1
    assert "precision: fp32 (auto: CPU has no native bfloat16)" in caplog.text


def test_precision_object_passes_through(probes):
    probes((), False)
    p = resolve_precision("fp32", "cpu", log=False)
    assert resolve_precision(p, "cuda") is p


def test_cpuinfo_flags_parsing(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16 amx_tile\n\n"
        "processor\t: 1\nflags\t\t: fpu sse avx512f amx_bf16\nbugs\t\t: spectre_v1\n"
    )
    flags = precision_module._read_cpu_flags(str(info))
    assert {"avx512_bf16", "amx_bf16", "amx_tile", "avx512f"} <= flags
    assert "spectre_v1" not in flags
    assert precision_module._read_cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_real_probe_returns_known_flags():
    flags = cpu_bf16_flags()
    assert isinstance(flags, tuple) and set(flags) <= {"avx512_bf16", "amx_bf16"}


@pytest.mark.parametrize("flags,gpu_bf16,setting,device", [(("avx512_bf16",), False, "auto", "cpu"),
                                                          ((), False, "auto", "cpu"),
                                                          ((), False, "fp16", "cuda")])  # fmt: skip
def test_autocast_and_amp_kwargs(probes, flags, gpu_bf16, setting, device):
    probes(flags, gpu_bf16)
    p = resolve_precision(setting, device, log=False)
    kwargs = autocast_kwargs(p)
    assert kwargs["device_type"] == p.device_type and kwargs["enabled"] is p.autocast
    if p.autocast:
        assert kwargs["dtype"] == p.dtype
    # MONAI's engines call torch.autocast("cuda", **amp_kwargs): amp_kwargs must not repeat the device type
    assert amp_kwargs(p) == p.amp_kwargs == {"dtype": p.dtype}
    with pytest.raises(ValueError, match="precision must be a Precision"):
        autocast_kwargs("bf16")


def test_context_runs_linear_in_bf16_on_cpu(probes):
    probes(("avx512_bf16",), False)
    lin = nn.Linear(4, 4)
    with resolve_precision("auto", "cpu", log=False).context():
        assert lin(torch.randn(2, 4)).dtype == BF16
        with autocast_off(torch.zeros(1)):
            assert lin(torch.randn(2, 4)).dtype == FP32
    with resolve_precision("fp32", "cpu", log=False).context():
        assert lin(torch.randn(2, 4)).dtype == FP32


class _Recorder(nn.Module):
    """1x1 conv that records the dtype it computed in, returning (logits, extra) to test nested outputs."""

    def __init__(self, channels: int = 2) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, channels, 1)
        self.seen: list[torch.dtype] = []

    def forward(self, x):
        y = self.conv(x)
        self.seen.append(y.dtype)
        return y


def test_autocast_inferer_simple_and_slice(probes):
    probes(("avx512_bf16",), False)
    net = _Recorder()
    inferer = AutocastInferer(precision="auto", device="cpu")
    out = inferer(torch.randn(2, 3, 8, 8), net)
    assert net.seen == [BF16] and out.dtype == FP32
    # slice-wise 3D: every slice batch under autocast, the aggregated volume in float32
    net.seen.clear()
    sliced = AutocastInferer(SliceInferer(roi_size=(8, 8), spatial_dim=2, sw_batch_size=3), "bf16", "cpu")
    vol = sliced(torch.randn(1, 3, 8, 8, 5), net)
    assert vol.shape == (1, 2, 8, 8, 5) and vol.dtype == FP32
    assert net.seen and set(net.seen) == {BF16}
    # fp32: the wrapped inferer unchanged
    net.seen.clear()
    assert AutocastInferer(precision="fp32", device="cpu")(torch.randn(1, 3, 8, 8), net).dtype == FP32
    assert net.seen == [FP32]


def test_autocast_inferer_casts_nested_outputs(probes):
    probes(("avx512_bf16",), False)
    lin = nn.Linear(4, 4)

    def network(x):
        y = lin(x)
        return y, {"a": y, "b": [y, 3]}, torch.arange(3)

    out = AutocastInferer(precision="bf16", device="cpu")(torch.randn(2, 4), network)
    assert out[0].dtype == FP32 and out[1]["a"].dtype == FP32 and out[1]["b"][0].dtype == FP32
    assert out[1]["b"][1] == 3 and out[2].dtype == torch.int64


def test_supervised_trainer_bf16_on_cpu(probes, tmp_path):
    """MONAI's trainer with amp=use_grad_scaler (False) and the autocast inferer: bf16 forward, float32 weights,
    finite loss, and a checkpoint that loads into a float32 model."""
    from monai.engines import SupervisedTrainer

    from spectraflow_monai.losses import DiceBCEBoundaryLoss

    probes(("avx512_bf16",), False)
    torch.manual_seed(0)
    p = resolve_precision("auto", "cpu", log=False)
    net = _Recorder(channels=1)
    data = [{"image": torch.randn(2, 3, 8, 8), "label": (torch.rand(2, 1, 8, 8) > 0.5).float()} for _ in range(2)]
    trainer = SupervisedTrainer(
        device=torch.device("cpu"),
        max_epochs=1,
        train_data_loader=data,
        network=net,
        optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
        loss_function=DiceBCEBoundaryLoss(beta=0.01),
        inferer=AutocastInferer(precision=p),
        amp=p.use_grad_scaler,
        amp_kwargs=p.amp_kwargs,
    )
    before = net.conv.weight.detach().clone()
    trainer.run()
    assert net.seen == [BF16, BF16]
    assert trainer.state.output[0]["pred"].dtype == FP32
    assert torch.isfinite(torch.as_tensor(trainer.state.output[0]["loss"]))
    assert net.conv.weight.dtype == FP32 and not torch.equal(net.conv.weight, before)
    path = tmp_path / "model.pt"
    torch.save(net.state_dict(), path)
    fresh = _Recorder(channels=1)
    fresh.load_state_dict(torch.load(path, weights_only=True))
    assert all(v.dtype == FP32 for v in fresh.state_dict().values())
