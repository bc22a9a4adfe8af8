"""The sampler's logits processors against vLLM's formulas: penalties, logit_bias, min_p, min_tokens,
allowed_token_ids, bad_words, logprob_token_ids; and the grammar mask (xgrammar) per row."""

from __future__ import annotations

import json
import re

import pytest
import torch

from radixflow.engine.sampling import (
    RowContext,
    Sampler,
    SamplingParams,
    apply_min_p,
    apply_penalties,
    banned_bad_words,
    process_row,
)
from radixflow.engine.structured import GrammarCompiler, GrammarSpec, GrammarState
from radixflow.engine.tiny import resolve_model
from radixflow.engine.tokenizer import Tokenizer


def test_frequency_and_presence_penalties_follow_the_openai_formula():
    row = torch.zeros(8)
    p = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    out = apply_penalties(row, p, prompt=[1, 2], output=[3, 3, 5])
    expected = torch.zeros(8)
    expected[3] = -0.5 * 2 - 0.25
    expected[5] = -0.5 * 1 - 0.25
    assert torch.allclose(out, expected)  # prompt tokens 1, 2 are not penalized by these two


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    row = torch.tensor([2.0, -2.0, 2.0, -2.0, 1.0])
    out = apply_penalties(row, SamplingParams(repetition_penalty=2.0), prompt=[0, 1], output=[4])
    assert out.tolist() == [1.0, -4.0, 2.0, -2.0, 0.5]


def test_logit_bias_forces_a_token_and_allowed_ids_restrict_the_draw():
    x = torch.randn(2, 30, generator=torch.Generator().manual_seed(0))
    forced = Sampler()(x, [SamplingParams(temperature=0, logit_bias={7: 100.0})] * 2)
    assert forced.token_ids == [7, 7]
    p = SamplingParams(temperature=1.0, seed=1, allowed_token_ids=[3, 11])
    draws = {Sampler()(x[:1], [p], [torch.Generator().manual_seed(s)]).token_ids[0] for s in range(20)}
    assert draws == {3, 11}


def test_min_tokens_masks_stop_tokens_until_enough_output():
    row = torch.zeros(10)
    row[9] = 50.0  # the stop token is by far the most likely
    p = SamplingParams(temperature=0, min_tokens=3)
    ctx = lambda n: RowContext(output=[1] * n, stop_token_ids=frozenset({9}))  # noqa: E731
    assert [Sampler()(row[None], [p], contexts=[ctx(n)]).token_ids[0] for n in range(5)] == [0, 0, 0, 9, 9]


def test_bad_words_ban_the_last_token_only_after_the_prefix():
    assert banned_bad_words([[4], [1, 2, 3]], output=[7, 1, 2]) == [4, 3]
    assert banned_bad_words([[4], [1, 2, 3]], output=[1, 7]) == [4]
    row = process_row(torch.zeros(6), SamplingParams(bad_words_token_ids=[[1, 2]]), RowContext(output=[1]))
    assert row[2] == float("-inf") and torch.isfinite(row[:2]).all()


def test_min_p_keeps_tokens_above_the_scaled_top_probability():
    x = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.isfinite(apply_min_p(x, 0.2)).tolist() == [True, True, True, False]
    assert torch.isfinite(apply_min_p(x, 0.7)).tolist() == [True, False, False, False]


def test_reported_logprobs_stay_raw_and_named_tokens_are_reported():
    x = torch.randn(1, 20, generator=torch.Generator().manual_seed(3))
    p = SamplingParams(temperature=0, logprobs=0, logit_bias={5: 100.0}, logprob_token_ids=[1, 5])
    out = Sampler()(x, [p])
    raw = x.log_softmax(-1)[0]
    assert out.token_ids == [5] and out.logprobs[0] == pytest.approx(float(raw[5]))
    assert [t for t, _ in out.top_logprobs[0]] == [1, 5]


def test_a_row_with_nothing_left_to_sample_falls_back_to_the_raw_logits():
    x = torch.tensor([[0.0, 1.0, 5.0, 2.0]])
    p = SamplingParams(temperature=0, allowed_token_ids=[2], bad_words_token_ids=[[2]])
    assert Sampler()(x, [p]).token_ids == [2]  # the batch is not failed for one row's contradiction
    other = SamplingParams(temperature=0, allowed_token_ids=[1])
    assert Sampler()(x.repeat(2, 1), [p, other]).token_ids == [2, 1]


def test_params_name_out_of_vocabulary_ids():
    with pytest.raises(ValueError, match="logit_bias: token id 99"):
        SamplingParams(logit_bias={99: 1.0}).check_vocab(50)
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(max_tokens=2, min_tokens=3)


# ---------------------------------------------------------------------------- grammar (xgrammar)
@pytest.fixture(scope="module")
def compiler():
    tok = Tokenizer.from_dir(resolve_model("tiny-qwen3.5"))
    return tok, GrammarCompiler(tok, 512)


def _walk(tok, compiler, spec: GrammarSpec, seed: int, steps: int = 200) -> str:
    """Random logits, masked by the grammar, sampled until the grammar terminates."""
    gen = torch.Generator().manual_seed(seed)
    g = compiler.compile(spec)
    st = GrammarState(g)
    p = SamplingParams(temperature=1.0, grammar=g)
    out: list[int] = []
    for _ in range(steps):
        x = torch.randn(1, 512, generator=gen)
        t = Sampler()(x, [p], [gen], [RowContext(output=out, grammar=st)]).token_ids[0]
        st.accept(t)
        if st.terminated:
            return tok.decode(out)
        out.append(t)
    raise AssertionError(f"grammar did not terminate in {steps} steps: {tok.decode(out)!r}")


def test_grammar_mask_keeps_choices_regexes_and_schemas(compiler):
    tok, c = compiler
    for seed in range(5):
        assert _walk(tok, c, GrammarSpec.choice(["yes", "no", "maybe so"]), seed) in {"yes", "no", "maybe so"}
        assert re.fullmatch(r"[a-c]{2}-\d", _walk(tok, c, GrammarSpec("regex", r"[a-c]{2}-\d"), seed))
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
              "required": ["ok", "n"], "additionalProperties": False}
    for seed in range(5):
        doc = json.loads(_walk(tok, c, GrammarSpec("json_schema", json.dumps(schema), any_whitespace=False), seed))
        assert set(doc) == {"ok", "n"} and isinstance(doc["ok"], bool) and doc["n"] in (1, 2, 3)


def test_bad_grammars_are_value_errors_naming_the_kind(compiler):
    _, c = compiler
    with pytest.raises(ValueError, match="regex"):
        c.compile(GrammarSpec("regex", "(unclosed"))
    with pytest.raises(ValueError, match="json_schema"):
        c.compile(GrammarSpec("json_schema", "{not json"))
    with pytest.raises(ValueError, match="choice"):
        GrammarSpec.choice([])
