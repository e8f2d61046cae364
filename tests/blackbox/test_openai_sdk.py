"""The gateway through the official OpenAI Python SDK, as a user's code
would call it, against the demo fleet of `infergate serve`."""

import httpx
import openai
import pytest

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture
def client(gateway):
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0, timeout=60)


def test_chat_completion(client):
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello!"}], max_tokens=8
    )
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content
    assert r.usage.completion_tokens == 8
    assert r.usage.prompt_tokens > 0


def test_streaming_chat_completion(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to ten."}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    assert len(pieces) >= 2, "a stream arrives in several events"
    assert usage is not None and usage.completion_tokens == 12


def test_legacy_completion(client):
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5)
    assert r.choices[0].text
    assert r.usage.completion_tokens == 5


def test_lora_adapter_routes_to_its_base_pool(client):
    r = client.chat.completions.create(
        model="sql-lora", messages=[{"role": "user", "content": "SELECT"}], max_tokens=4
    )
    assert r.usage.completion_tokens == 4


def test_models_list_has_models_and_adapters(client):
    models = {m.id: m for m in client.models.list()}
    assert MODEL in models
    assert "Qwen/Qwen3-32B" in models
    assert models["sql-lora"].model_extra["parent"] == MODEL


def test_models_retrieve_serves_models_and_adapters(client):
    # A model id with a slash, as Hugging Face names are.
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL
    adapter = client.models.retrieve("sql-lora")
    assert adapter.model_extra["parent"] == MODEL
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-nonexistent")
    assert err.value.code == "model_not_found"


def test_unknown_model_is_a_404_the_sdk_understands(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(
            model="gpt-nonexistent", messages=[{"role": "user", "content": "hi"}]
        )
    assert err.value.code == "model_not_found"


def test_bad_input_is_a_400_in_openai_shape(gateway):
    for body in [b'{"model": ', b'{"messages": []}', b'{"model": 5}']:
        r = httpx.post(
            f"{gateway.base_url}/chat/completions",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400, body
        error = r.json()["error"]
        assert set(error) >= {"message", "type", "param", "code"}


def test_request_id_round_trips(gateway):
    r = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
        headers={"x-request-id": "sdk-test-1"},
        timeout=60,
    )
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "sdk-test-1"


def test_a_crashed_replica_costs_no_failed_requests(gateway, client):
    # Crash one simulated replica of the Qwen pool (two replicas); every
    # request still succeeds on the other.
    victim = gateway.pools["qwen-32b"][0]
    httpx.post(f"http://{victim}/admin/crash", timeout=10)
    for _ in range(6):
        r = client.chat.completions.create(
            model="Qwen/Qwen3-32B", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert r.usage.completion_tokens == 2


def test_an_api_key_authenticates_and_a_wrong_one_is_an_authentication_error(authed_gateway):
    good = openai.OpenAI(
        base_url=authed_gateway.base_url, api_key=authed_gateway.key, max_retries=0, timeout=60
    )
    r = good.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello!"}], max_tokens=4
    )
    assert r.usage.completion_tokens == 4
    assert [m.id for m in good.models.list()] == [MODEL]

    wrong = openai.OpenAI(
        base_url=authed_gateway.base_url, api_key="ig-not-a-key", max_retries=0, timeout=60
    )
    with pytest.raises(openai.AuthenticationError) as err:
        wrong.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 401
    assert err.value.code == "invalid_api_key"
    assert err.value.response.headers["www-authenticate"].startswith("Bearer")
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
