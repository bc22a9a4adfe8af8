"""Sampler and SamplingParams: greedy, seeded draws, top-k/top-p masks, logprobs, validation."""

from __future__ import annotations

import math

import pytest
import torch

from radixflow.engine.sampling import (
    Sampler,
    SamplingParams,
    apply_top_k,
    apply_top_p,
    make_generator,
)


def logits(n: int = 3, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    x = logits()
    out = Sampler()(x, [SamplingParams(temperature=0)] * 3)
    assert out.token_ids == x.argmax(-1).tolist()
    assert out.logprobs == [None] * 3


def test_seeded_draws_are_reproducible_and_independent_of_batch():
    x = logits(4)
    p = SamplingParams(temperature=1.0, seed=7)
    def draw(rows):
        return Sampler()(x[rows], [p] * len(rows), [make_generator(p) for _ in rows]).token_ids
    assert draw([0, 1, 2, 3]) == draw([0, 1, 2, 3])
    assert draw([2]) == [draw([0, 1, 2, 3])[2]]


def test_unseeded_sampling_varies():
    x = torch.zeros(1, 1000)
    p = SamplingParams(temperature=1.0)
    draws = {Sampler()(x, [p], [make_generator(p)]).token_ids[0] for _ in range(20)}
    assert len(draws) > 1


def test_top_k_keeps_exactly_k():
    x = logits(2)
    masked = apply_top_k(x, 5)
    assert (torch.isfinite(masked).sum(-1) == 5).all()
    assert torch.equal(masked.argmax(-1), x.argmax(-1))


def test_top_p_keeps_smallest_nucleus():
    x = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert torch.isfinite(apply_top_p(x, 0.7)).tolist() == [[True, True, False, False]]
    assert torch.isfinite(apply_top_p(x, 0.5)).tolist() == [[True, False, False, False]]
    assert torch.isfinite(apply_top_p(x, 0.01)).sum() == 1


def test_sampling_respects_top_k():
    x = logits(1, 100)
    allowed = set(torch.topk(x[0], 3).indices.tolist())
    p = SamplingParams(temperature=5.0, top_k=3, seed=1)
    g = make_generator(p)
    assert all(Sampler()(x, [p], [g]).token_ids[0] in allowed for _ in range(30))


def test_logprobs_normalised_and_topk_sorted():
    x = logits(2)
    p = SamplingParams(temperature=0, logprobs=5)
    out = Sampler()(x, [p, SamplingParams(temperature=0)])
    logp = x[0].log_softmax(-1)
    assert math.isclose(float(logp.exp().sum()), 1.0, rel_tol=1e-5)
    assert out.logprobs[0] == pytest.approx(float(logp.max()), abs=1e-6)
    top = out.top_logprobs[0]
    assert [t for t, _ in top][0] == out.token_ids[0]
    assert [v for _, v in top] == sorted((v for _, v in top), reverse=True)
    assert out.logprobs[1] is None and out.top_logprobs[1] is None


def test_logprobs_zero_gives_only_chosen():
    out = Sampler()(logits(1), [SamplingParams(temperature=0, logprobs=0)])
    assert out.logprobs[0] is not None and out.top_logprobs[0] == []


@pytest.mark.parametrize("field, value", [
    ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -3), ("max_tokens", 0),
    ("logprobs", -1), ("stop_token_ids", [-1]), ("stop", [""]),
])
def test_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_max_new_tokens_alias():
    assert SamplingParams(max_new_tokens=5).max_tokens == 5
    assert SamplingParams(max_tokens=7).max_new_tokens == 7


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="rows"):
        Sampler()(logits(2), [SamplingParams()])
