"""Multi-process (gloo) test of MeanFlowPretrainer's gradient all-reduce, which replaces DistributedDataParallel."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from spectraflow_monai.engines import EMAConfig, GradientConfig, MeanFlowPretrainer

WORLD = 2
N_ITER = 3
ENC_KW = {"model_name": "vit_small_patch14_dinov2", "img_size": 28, "model_kwargs": {"depth": 3}}


def _modules(seed: int):
    from spectraflow_monai.networks.encoders.dinov2 import DINOv2Encoder
    from spectraflow_monai.networks.nets.meanflow_head import MeanFlowHead

    torch.manual_seed(seed)
    encoder = DINOv2Encoder(**ENC_KW, trainable_blocks="all")
    head = MeanFlowHead(encoder.embed_dim, hidden_channels=32, num_blocks=1, num_heads=4)
    # non-zero output layer so that the MeanFlow gradient reaches the encoder from the first step
    torch.nn.init.normal_(head.out_proj.weight, std=0.02)
    return encoder, head


def _shard(rank: int) -> list[dict]:
    """Batches of one rank; "seed" fixes the noise/time draws of each batch (same in the reference run)."""
    g = torch.Generator().manual_seed(1000 + rank)
    return [
        {
            "image": torch.randn(2, 3, 28, 28, generator=g),
            "domain": torch.tensor([rank, 1 - rank]),
            "seed": 100 * k + rank,
        }
        for k in range(N_ITER)
    ]


def _trainer(encoder, head, data, accumulation_steps: int) -> MeanFlowPretrainer:
    from ignite.engine import Events

    opt = torch.optim.AdamW(encoder.trainable_parameters() + list(head.parameters()), lr=1e-3)
    gradients = GradientConfig(accumulation_steps=accumulation_steps, bucket_mb=0.5)
    trainer = MeanFlowPretrainer("cpu", 1, data, encoder, head, opt, ema=EMAConfig(0.5), gradients=gradients)
    trainer.add_event_handler(Events.ITERATION_STARTED, lambda e: torch.manual_seed(int(e.state.batch["seed"])))
    return trainer


def _flat(*modules) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for m in modules for p in m.parameters()])


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        encoder, head = _modules(seed=rank)  # different initial weights per rank: rank 0's are broadcast
        start = _flat(encoder, head)
        trainer = _trainer(encoder, head, _shard(rank), accumulation_steps=1)
        trainer.run()
        assert trainer.distributed and trainer.world_size == WORLD
        final = _flat(encoder, head, trainer.ema_encoder)
        gathered = [torch.empty_like(final) for _ in range(WORLD)]
        dist.all_gather(gathered, final)
        result = {
            "identical": all(torch.equal(gathered[0], g) for g in gathered),
            "moved": float((final[: start.numel()] - start).abs().max()),
            "final": final,
        }
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two spawned interpreters each import torch/monai/timm: ~15-20 s on 2 busy cores
def test_gradient_all_reduce_matches_single_process(tmp_path):
    torch.set_num_threads(1)
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    assert all(r["identical"] for r in results)  # encoder, head and EMA equal on all ranks (all_gather)
    assert results[0]["moved"] > 1e-4

    # reference: one process, accumulation over the shards seen one after another, rank 0's initial weights
    shards = [_shard(r) for r in range(WORLD)]
    interleaved = [shards[r][k] for k in range(N_ITER) for r in range(WORLD)]
    encoder, head = _modules(seed=0)
    trainer = _trainer(encoder, head, interleaved, accumulation_steps=WORLD)
    trainer.run()
    assert not trainer.distributed
    reference = _flat(encoder, head, trainer.ema_encoder)
    assert torch.allclose(results[0]["final"], reference, atol=1e-5, rtol=0)
    # and the comparison is not trivial: the rank-1 start differs from rank 0's
    assert not torch.equal(_flat(*_modules(seed=1)), _flat(*_modules(seed=0)))
