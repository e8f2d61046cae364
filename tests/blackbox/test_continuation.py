"""Through the OpenAI SDK: streams whose replicas break mid-answer go on
from another replica, and the client's code sees one whole answer, the
same as an uninterrupted one (the demo's simulated replicas share a seed,
so a prompt gets the same answer on each)."""

import json
import re
import urllib.request

import openai

from conftest import demo

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
POOL = "llama-8b"
MAX_TOKENS = 12


def post_json(url, body):
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)


def streamed(client, content):
    """The answer as the SDK's user reads it: text, ids, finishes, usage."""
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, ids, finishes, usage = [], set(), [], []
    for chunk in stream:
        ids.add(chunk.id)
        for choice in chunk.choices:
            if choice.delta.content:
                text.append(choice.delta.content)
            if choice.finish_reason:
                finishes.append(choice.finish_reason)
        if chunk.usage:
            usage.append(chunk.usage)
    return "".join(text), ids, finishes, usage


def migrations(admin):
    with urllib.request.urlopen(f"http://{admin}/metrics", timeout=30) as resp:
        metrics = resp.read().decode()
    pattern = rf'infergate_migrations_total{{pool="{POOL}",reason="broken",outcome="continued"}} (\S+)'
    found = re.search(pattern, metrics)
    return float(found.group(1)) if found else 0.0


def test_a_stream_cut_mid_answer_reaches_the_sdk_whole():
    with demo() as gw:
        client = openai.OpenAI(base_url=gw.base_url, api_key="unused", max_retries=0, timeout=60)
        prompts = [f"Tell me about the number {n}." for n in range(6)]
        whole = {p: streamed(client, p) for p in prompts}
        # Every replica cuts each answer (and each continuation) after 5
        # tokens: a 12-token answer is cut twice and continued twice (5, 5
        # and 2 tokens), the pool's default attempts.
        for replica in gw.pools[POOL]:
            post_json(f"http://{replica}/admin/faults", {"cut_after_tokens": 5})
        for prompt in prompts:
            text, ids, finishes, usage = streamed(client, prompt)
            want_text, _, want_finishes, want_usage = whole[prompt]
            assert text == want_text
            assert len(ids) == 1, f"one id for the whole answer: {ids}"
            assert finishes == want_finishes == ["length"]
            assert len(usage) == 1
            assert usage[0].completion_tokens == want_usage[0].completion_tokens == MAX_TOKENS
        assert migrations(gw.admin) == 2 * len(prompts), "each answer continued twice"
