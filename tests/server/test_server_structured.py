"""Structured output over real HTTP on a random-weight model: whatever the weights say, a
`json_schema` answer parses and validates, a choice is one of the choices, a regex answer matches."""

from __future__ import annotations

import json
import re

import pytest
from server_harness import error_of

MODEL = "tiny-qwen3.5"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,8}$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "admin": {"type": "boolean"},
        "tier": {"enum": ["free", "pro"]},
    },
    "required": ["name", "age", "admin", "tier"],
    "additionalProperties": False,
}


def validate(doc) -> None:
    """The checks SCHEMA makes, written out (no JSON-Schema library in the test dependencies)."""
    assert isinstance(doc, dict) and set(doc) == set(SCHEMA["required"]), doc
    assert isinstance(doc["name"], str) and re.fullmatch("[a-z]{1,8}", doc["name"]), doc
    assert isinstance(doc["age"], int) and not isinstance(doc["age"], bool) and 0 <= doc["age"] <= 120, doc
    assert isinstance(doc["admin"], bool) and doc["tier"] in ("free", "pro"), doc


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_schema_response_parses_and_validates(hybrid_server, seed):
    client = hybrid_server.client()
    out = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Make up a user."}], max_tokens=300, seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "user", "schema": SCHEMA}})
    choice = out.choices[0]
    assert choice.finish_reason == "stop"
    validate(json.loads(choice.message.content))


def test_json_schema_in_every_spelling_and_stream(hybrid_server):
    client = hybrid_server.client()
    kw = dict(model=MODEL, prompt="user:", max_tokens=300, seed=4)
    for extra in ({"guided_json": SCHEMA}, {"structured_outputs": {"json": SCHEMA}}):
        validate(json.loads(client.completions.create(**kw, extra_body=extra).choices[0].text))
    compact = {"structured_outputs": {"json": json.dumps(SCHEMA), "disable_any_whitespace": True}}
    text = client.completions.create(**kw, extra_body=compact).choices[0].text
    validate(json.loads(text))
    assert not re.search(r"\s", re.sub(r'"[^"]*"', "", text)), text  # no whitespace outside strings
    stream = client.completions.create(**kw, stream=True, extra_body={"guided_json": SCHEMA})
    validate(json.loads("".join(c.choices[0].text for c in stream if c.choices)))


def test_json_object_is_any_json_object(hybrid_server):
    client = hybrid_server.client()
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "json"}],
                                         max_tokens=400, seed=3, response_format={"type": "json_object"})
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(out.choices[0].message.content), dict)


@pytest.mark.parametrize("seed", range(4))
def test_guided_choice_answer_is_one_of_the_choices(hybrid_server, seed):
    choices = ["positive", "negative", "neutral"]
    client = hybrid_server.client()
    out = client.completions.create(model=MODEL, prompt="Sentiment:", max_tokens=20, seed=seed, n=2,
                                    extra_body={"guided_choice": choices})
    assert all(c.text in choices and c.finish_reason == "stop" for c in out.choices)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "pick"}],
                                          max_tokens=20, seed=seed,
                                          extra_body={"structured_outputs": {"choice": choices}})
    assert chat.choices[0].message.content in choices


def test_guided_regex_and_grammar(hybrid_server):
    client = hybrid_server.client()
    for seed in range(3):
        text = client.completions.create(model=MODEL, prompt="date:", max_tokens=20, seed=seed,
                                         extra_body={"guided_regex": r"20\d\d-(0[1-9]|1[0-2])"}).choices[0].text
        assert re.fullmatch(r"20\d\d-(0[1-9]|1[0-2])", text), text
    text = client.completions.create(model=MODEL, prompt="g:", max_tokens=20, seed=1, extra_body={
        "structured_outputs": {"grammar": 'root ::= "x" ("+" "x")*'}}).choices[0].text
    assert re.fullmatch(r"x(\+x)*", text), text


def test_conflicting_or_unsupported_constraints_are_400s(hybrid_server):
    base = {"model": MODEL, "prompt": "x", "max_tokens": 4}
    r = hybrid_server.post("/v1/completions", json={**base, "guided_choice": ["a"], "guided_regex": "b"})
    assert r.status_code == 400 and "only one structured-output constraint" in error_of(r)["message"]
    r = hybrid_server.post("/v1/completions", json={**base, "structured_outputs": {"choice": ["a"], "regex": "b"}})
    assert r.status_code == 400 and error_of(r)["param"] == "structured_outputs"
    r = hybrid_server.post("/v1/completions", json={**base, "response_format": {"type": "json_schema"}})
    assert r.status_code == 400 and error_of(r)["param"] == "response_format"
    r = hybrid_server.post("/v1/completions", json={**base, "structured_outputs": {"whitespace_pattern": " "}})
    assert r.status_code == 400 and "whitespace_pattern" in error_of(r)["message"]
