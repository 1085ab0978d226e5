"""Batch norm over the global batch on CPU: two gloo ranks, each with half the images, against one process with all."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from workloads.ray_train.sync_batchnorm import SyncedBatchNorm, synchronise_batch_norm

BATCH, CHANNELS, SIDE = 8, 3, 5


def inputs(dtype=torch.float32):
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(BATCH, CHANNELS, SIDE, SIDE, generator=generator) * 3 + 1
    upstream = torch.randn(BATCH, CHANNELS, SIDE, SIDE, generator=generator)  # d(loss)/d(output)
    return images.to(dtype), upstream


def layer() -> nn.BatchNorm2d:
    norm = nn.BatchNorm2d(CHANNELS)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([0.5, 1.5, -1.0]))
        norm.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    return norm


def one_process_with_every_image() -> dict:
    images, upstream = inputs()
    images.requires_grad_(True)
    norm = layer().train()
    out = norm(images)
    (out * upstream).sum().backward()
    return {"out": out.detach(), "grad_in": images.grad, "grad_weight": norm.weight.grad,
            "grad_bias": norm.bias.grad, "running_mean": norm.running_mean, "running_var": norm.running_var}


def rank_main(rank: int, world: int, port: int, dtype_name: str, results, first_share: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        images, upstream = inputs(getattr(torch, dtype_name))
        share = slice(0, first_share) if rank == 0 else slice(first_share, BATCH)
        mine = images[share].clone().requires_grad_(True)
        model = synchronise_batch_norm(nn.Sequential(layer()), "cpu").train()
        assert isinstance(model[0], SyncedBatchNorm)
        out = model(mine)
        (out.float() * upstream[share]).sum().backward()
        norm = model[0]
        results[rank] = {"out": out.detach().float(), "grad_in": mine.grad.float(),
                         "grad_weight": norm.weight.grad.clone(), "grad_bias": norm.bias.grad.clone(),
                         "running_mean": norm.running_mean.clone(), "running_var": norm.running_var.clone()}
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def two_ranks(dtype_name: str = "float32", first_share: int = BATCH // 2) -> list[dict]:
    """Both ranks' results; rank 0 holds the first ``first_share`` images, rank 1 the rest."""
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(rank_main, args=(2, free_port(), dtype_name, results, first_share), nprocs=2, join=True)
        return [results[0], results[1]]


# 3 and 5: an epoch's last batch splits unevenly, and each rank's moments must weigh by its own count.
@pytest.mark.processes
@pytest.mark.parametrize("first_share", [BATCH // 2, 3], ids=["even-shares", "uneven-shares"])
def test_two_ranks_normalize_and_backpropagate_as_one_process_holding_every_image(first_share):
    whole = one_process_with_every_image()
    ranks = two_ranks(first_share=first_share)
    close = {"atol": 1e-5, "rtol": 1e-4}
    torch.testing.assert_close(torch.cat([rank["out"] for rank in ranks]), whole["out"], **close)
    torch.testing.assert_close(torch.cat([rank["grad_in"] for rank in ranks]), whole["grad_in"], **close)
    # Each rank holds its own images' share of the parameters' gradients; DDP sums (and averages) them.
    torch.testing.assert_close(ranks[0]["grad_weight"] + ranks[1]["grad_weight"], whole["grad_weight"], **close)
    torch.testing.assert_close(ranks[0]["grad_bias"] + ranks[1]["grad_bias"], whole["grad_bias"], **close)
    for rank in ranks:  # the running statistics are the global batch's, the same on every rank
        torch.testing.assert_close(rank["running_mean"], whole["running_mean"], **close)
        torch.testing.assert_close(rank["running_var"], whole["running_var"], **close)


@pytest.mark.processes
def test_bf16_inputs_keep_the_moments_in_fp32():
    whole = one_process_with_every_image()
    ranks = two_ranks("bfloat16")
    # Only the input's and output's rounding to bf16 separates them from the fp32 layer.
    torch.testing.assert_close(torch.cat([rank["out"] for rank in ranks]), whole["out"], atol=0.05, rtol=0.02)
    torch.testing.assert_close(ranks[0]["running_mean"], whole["running_mean"], atol=0.02, rtol=0.01)


def test_one_process_and_evaluation_are_plain_batch_norm():
    images, _ = inputs()
    plain, synced = layer(), synchronise_batch_norm(nn.Sequential(layer()), "cpu")[0]
    torch.testing.assert_close(synced.train()(images), plain.train()(images))
    torch.testing.assert_close(synced.eval()(images), plain.eval()(images))
    # Its checkpoints are a plain model's.
    assert set(synced.state_dict()) == set(plain.state_dict())
    nn.BatchNorm2d(CHANNELS).load_state_dict(synced.state_dict())


@pytest.mark.parametrize("frozen", [True, False])
def test_conversion_keeps_the_layers_weights_and_whether_they_train(frozen):
    model = nn.Sequential(nn.Conv2d(3, CHANNELS, 1), layer())
    model[1].weight.requires_grad_(not frozen)
    converted = synchronise_batch_norm(model, "cpu")
    assert isinstance(converted[1], SyncedBatchNorm) and isinstance(converted[0], nn.Conv2d)
    assert converted[1].weight.requires_grad is (not frozen)
    torch.testing.assert_close(converted[1].weight.detach(), torch.tensor([0.5, 1.5, -1.0]))
