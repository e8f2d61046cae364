"""Start the real `infergate` binary the way a user does: `infergate serve`
with no config (the demo fleet), on free ports."""

import json
import os
import re
import subprocess
import tempfile
import threading

import pytest

BINARY = os.environ.get("INFERGATE_BIN", "target/debug/infergate")


class Gateway:
    def __init__(self, proc, addr, admin, pools):
        self.proc = proc
        self.addr = addr
        self.admin = admin
        self.pools = pools  # pool name -> [replica addresses]

    @property
    def base_url(self):
        return f"http://{self.addr}/v1"


@pytest.fixture(scope="session")
def gateway():
    proc = subprocess.Popen(
        [BINARY, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    addr, admin, pools = None, None, {}
    timer = threading.Timer(60, proc.kill)  # never hang the suite
    timer.start()
    for line in proc.stdout:
        if m := re.match(r"infergate demo: a gateway on http://(\S+)", line):
            addr = m.group(1)
        elif m := re.match(r"\s+pool (\S+): (.*)", line):
            pools[m.group(1)] = [a.strip() for a in m.group(2).split(",")]
        elif m := re.match(r"\s+admin: http://([^/]+)/", line):
            admin = m.group(1)
        elif line.startswith("Press Ctrl-C"):
            break
    timer.cancel()
    assert addr, "the demo did not print its address"
    yield Gateway(proc, addr, admin, pools)
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


class AuthedGateway:
    def __init__(self, proc, addr, key):
        self.proc = proc
        self.addr = addr
        self.key = key  # a key of tenant `sdk`, made by `infergate keys new`

    @property
    def base_url(self):
        return f"http://{self.addr}/v1"


@pytest.fixture(scope="session")
def authed_gateway():
    """`infergate serve --config` with API keys required, one simulated
    replica, and a key made by `infergate keys new`."""
    made = subprocess.run(
        [BINARY, "keys", "new", "--tenant", "sdk"], capture_output=True, text=True, check=True
    )
    key, line = made.stdout.splitlines()
    config = f"""apiVersion: infergate.dev/v1alpha1
kind: InferenceGatewayConfig
spec:
  listeners: [{{name: public, address: "127.0.0.1:0"}}]
  auth:
    apiKeys:
      keys:
        {line}
  pools:
    - name: llama-8b
      models: ["meta-llama/Llama-3.1-8B-Instruct"]
      simulated: {{replicas: 1, hardware: [h100], model: llama-3.1-8b, timeScale: 10}}
"""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(config)
    proc = subprocess.Popen(
        [BINARY, "serve", "--log-format", "json", "--config", f.name],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    addr = None
    timer = threading.Timer(60, proc.kill)  # never hang the suite
    timer.start()
    for line in proc.stderr:
        if '"listening"' in line:
            log = json.loads(line)
            addr = log.get("fields", {}).get("addr") or log.get("addr")
            break
    timer.cancel()
    # Keep reading the logs so the process never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    assert addr, "the gateway did not log its address"
    yield AuthedGateway(proc, addr, key)
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
    os.unlink(f.name)
