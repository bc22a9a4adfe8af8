"""/v1/chat/completions through the openai client: the model's chat template, streaming, logprobs."""

from __future__ import annotations

from radixflow.engine.tiny import ensure_tiny_model
from radixflow.engine.tokenizer import Tokenizer

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi."}]


def test_chat_uses_the_chat_template(hybrid_server):
    client = hybrid_server.client()
    out = client.chat.completions.create(model="tiny-qwen3.5", messages=MESSAGES, max_tokens=5, temperature=0,
                                         extra_body={"ignore_eos": True})
    tok = Tokenizer.from_dir(ensure_tiny_model("tiny-qwen3.5"))
    assert out.usage.prompt_tokens == len(tok.encode_chat(MESSAGES))
    assert out.choices[0].message.role == "assistant"
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 5
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")


def test_chat_stream_matches_non_stream(hybrid_server):
    client = hybrid_server.client()
    kw = dict(model="tiny-qwen3.5", messages=MESSAGES, max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 6
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_chat_logprobs_and_content_parts(hybrid_server):
    client = hybrid_server.client()
    messages = [{"role": "user", "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "hi."}]}]
    out = client.chat.completions.create(model="tiny-qwen3.5", messages=messages, max_tokens=3, temperature=0,
                                         logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = out.choices[0].logprobs.content
    assert len(content) == 3
    assert all(len(e.top_logprobs) == 3 for e in content)
    assert all(abs(e.logprob - e.top_logprobs[0].logprob) < 1e-5 for e in content)  # greedy
    plain = client.chat.completions.create(model="tiny-qwen3.5", messages=[{"role": "user", "content": "Say hi."}],
                                           max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert plain.choices[0].message.content == out.choices[0].message.content


def test_chat_default_max_tokens_and_seeded_sampling(hybrid_server):
    client = hybrid_server.client()
    a = client.chat.completions.create(model="tiny-qwen3.5", messages=MESSAGES, seed=11, temperature=1.0,
                                       extra_body={"ignore_eos": True})
    b = client.chat.completions.create(model="tiny-qwen3.5", messages=MESSAGES, seed=11, temperature=1.0,
                                       extra_body={"ignore_eos": True})
    assert a.usage.completion_tokens == 16  # the test server's --default-max-tokens
    assert a.choices[0].message.content == b.choices[0].message.content
