"""Rate limits through the official OpenAI Python SDK: a refusal is the
SDK's RateLimitError, and the SDK's own retry, honouring the gateway's
Retry-After, ends in success."""

import time

import openai
import pytest

CONFIG = """
apiVersion: infergate.dev/v1alpha1
kind: InferenceGatewayConfig
spec:
  listeners: [{name: public, address: "127.0.0.1:0"}]
  rateLimits: {global: {requestsPerSecond: 1}}
  pools:
    - name: p
      engine: vllm
      models: [m]
      simulated: {replicas: 1, hardware: [h100], model: llama-3.1-8b, timeScale: 100}
"""


def ask(client):
    return client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "Hello!"}], max_tokens=4
    )


def test_over_the_limit_is_a_rate_limit_error_and_the_sdk_retry_succeeds(serve):
    gw = serve(CONFIG)
    no_retry = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=60)
    ask(no_retry)
    with pytest.raises(openai.RateLimitError) as refused:
        ask(no_retry)
    assert refused.value.code == "rate_limit_exceeded"
    headers = refused.value.response.headers
    assert headers["x-ratelimit-limit-requests"] == "1"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert 0 < int(headers["retry-after-ms"]) <= 1000

    # The SDK's default retries wait as Retry-After says, and get through.
    retrying = openai.OpenAI(base_url=gw.base_url, api_key="unused", timeout=60)
    started = time.monotonic()
    raw = retrying.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "Hello!"}], max_tokens=4
    )
    assert raw.http_response.status_code == 200
    assert raw.parse().choices[0].message.content
    # It did wait for the limit (not hammer it), and not for long.
    assert time.monotonic() - started < 10
