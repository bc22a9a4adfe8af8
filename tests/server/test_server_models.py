"""GET /v1/models and /v1/models/{id} (the OpenAI client's models.list and models.retrieve)."""

from __future__ import annotations

import httpx
import openai
import pytest
from server_harness import error_of


def test_retrieve_returns_the_listed_card(hybrid_server):
    client = hybrid_server.client()
    listed = client.models.list().data
    assert [m.id for m in listed] == [hybrid_server.model]
    card = client.models.retrieve(hybrid_server.model)
    assert card.id == hybrid_server.model and card.object == "model" and card.owned_by == "radixflow"
    assert card.model_dump() == listed[0].model_dump()


@pytest.mark.parametrize("name", ["gpt-4o", "Qwen/Qwen3-8B", "tiny-qwen3.5-x"])
def test_an_unknown_model_is_a_404_in_openai_shape(hybrid_server, name):
    with pytest.raises(openai.NotFoundError) as e:
        hybrid_server.client().models.retrieve(name)
    assert e.value.body["code"] == "model_not_found" and name in e.value.body["message"]

    r = httpx.get(f"{hybrid_server.url}/v1/models/{name}", timeout=10)
    err = error_of(r)
    assert r.status_code == 404 and err["type"] == "invalid_request_error" and err["param"] == "model"
