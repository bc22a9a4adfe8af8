"""ModelCache bookkeeping and RowInput validation."""

from __future__ import annotations

import pytest
import torch

from radixflow.engine.models import RowInput, build_model
from radixflow.engine.tiny import TINY_CONFIGS


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return {name: build_model(cfg) for name, cfg in TINY_CONFIGS.items()}


def test_layout_and_bytes(models):
    q35 = models["tiny-qwen3.5"].allocate_cache(4, 16, 3)
    assert len(q35.k) == 2 and len(q35.conv) == 6 and q35.conv[0].shape == (3, 3, 2 * 64 + 128)
    assert q35.rec[0].shape == (3, 4, 32, 32) and q35.rec[0].dtype == torch.float32
    assert q35.kv_bytes_per_token == 2 * 2 * 2 * 32 * 4
    assert q35.state_bytes_per_slot == 6 * (256 * 3 + 4 * 32 * 32) * 4
    q3 = models["tiny-qwen3"].allocate_cache(4, 16, 3)
    assert not models["tiny-qwen3"].is_hybrid and q3.conv == [] and q3.state_bytes_per_slot == 0
    assert models["tiny-nemotron-h"].is_hybrid


def test_copy_state_and_page(models):
    cache = models["tiny-nemotron-h"].allocate_cache(4, 16, 3)
    for t in (*cache.conv, *cache.rec, *cache.k, *cache.v):
        t.normal_()
    cache.copy_state(0, 2)
    assert all(torch.equal(t[0], t[2]) for t in (*cache.conv, *cache.rec))
    assert not torch.equal(cache.rec[0][1], cache.rec[0][2])
    cache.copy_page(1, 3)
    assert all(torch.equal(t[1], t[3]) for t in (*cache.k, *cache.v))
    with pytest.raises(IndexError):
        cache.copy_state(0, 3)
    with pytest.raises(IndexError):
        cache.copy_page(4, 0)


def test_bf16_cache_keeps_fp32_state(models):
    cache = models["tiny-qwen3.5"].allocate_cache(2, 16, 1, dtype=torch.bfloat16)
    assert cache.k[0].dtype == torch.bfloat16 and cache.conv[0].dtype == torch.bfloat16
    assert cache.rec[0].dtype == torch.float32


@pytest.mark.parametrize("row, message", [
    (RowInput([], 0, [0]), "empty"),
    (RowInput([1, 2], 0, []), "page_table"),
    (RowInput([1, 2], 0, [9]), "page id"),
    (RowInput([1, 2], 0, [0], logits_at=[2]), "logits_at"),
    (RowInput([1, 2], 16, [0, 1]), "state_in is None"),
    (RowInput([1, 2], 0, [0], state_in=5), "state_in slot"),
    (RowInput([1, 2], 0, [0], state_out=[(3, 0)]), "state_out point"),
    (RowInput([1, 2], 0, [0], state_out=[(2, 7)]), "state_out slot"),
])
def test_row_validation(models, row, message):
    model = models["tiny-qwen3.5"]
    with pytest.raises(ValueError, match=message):
        model([row], model.allocate_cache(2, 16, 2))


def test_full_attention_ignores_states(models):
    model = models["tiny-qwen3"]
    out = model([RowInput([1, 2, 3], 16, [0, 1], None, [(3, 9)], [2])], model.allocate_cache(2, 16, 0))
    assert out.shape == (1, 512)


def test_no_rows_gives_no_logits(models):
    model = models["tiny-nemotron-h"]
    assert model([], model.allocate_cache(2, 16, 1)).shape == (0, 512)
