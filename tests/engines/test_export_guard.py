from __future__ import annotations

import pytest
import torch

from spectraflow_monai.engines import save_encoder_export
from spectraflow_monai.utils.checkpoint import NonFiniteStateError


def test_encoder_export_refuses_non_finite_weights_and_keeps_the_earlier_file(tmp_path):
    encoder = torch.nn.Linear(3, 2)
    path = save_encoder_export(encoder, tmp_path / "encoder_stage1.pt")
    before = torch.load(path, weights_only=True)
    with torch.no_grad():
        encoder.bias[1] = float("inf")
    with pytest.raises(NonFiniteStateError, match="bias"):
        save_encoder_export(encoder, path)
    after = torch.load(path, weights_only=True)
    assert all(torch.equal(before[k], after[k]) for k in before)
