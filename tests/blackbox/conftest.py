"""Start the real `infergate` binary the way a user does: `infergate serve`
with no config (the demo fleet), on free ports."""

import contextlib
import json
import os
import re
import subprocess
import tempfile
import threading

import pytest

BINARY = os.environ.get("INFERGATE_BIN", "target/debug/infergate")


class Gateway:
    def __init__(self, proc, addr, admin, pools, page):
        self.proc = proc
        self.addr = addr
        self.admin = admin
        self.pools = pools  # pool name -> [replica addresses]
        self.page = page  # the fleet page's URL, as the banner prints it

    @property
    def base_url(self):
        return f"http://{self.addr}/v1"


@contextlib.contextmanager
def demo():
    """A demo gateway of its own: `infergate serve` with no config, on free
    ports, stopped when the block ends."""
    proc = subprocess.Popen(
        [BINARY, "serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    addr, admin, pools, page = None, None, {}, None
    timer = threading.Timer(60, proc.kill)  # never hang the suite
    timer.start()
    for line in proc.stdout:
        if m := re.match(r"infergate demo: a gateway on http://(\S+)", line):
            addr = m.group(1)
        elif m := re.match(r"\s+pool (\S+): (.*)", line):
            pools[m.group(1)] = [a.strip() for a in m.group(2).split(",")]
        elif m := re.match(r"\s+admin: http://([^/]+)/", line):
            admin = m.group(1)
        elif m := re.match(r"\s+fleet page: (http://\S+)", line):
            page = m.group(1)
        elif line.startswith("Press Ctrl-C"):
            break
    timer.cancel()
    assert addr, "the demo did not print its address"
    try:
        yield Gateway(proc, addr, admin, pools, page)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def gateway():
    with demo() as gw:
        yield gw


class Served:
    """`infergate serve --config FILE`, its public address read from the
    `listening` log line."""

    def __init__(self, tmp_path, yaml):
        path = tmp_path / "config.yaml"
        path.write_text(yaml)
        self.proc = subprocess.Popen(
            [BINARY, "serve", "--config", str(path), "--log-format", "json"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.addr = None
        timer = threading.Timer(60, self.proc.kill)  # never hang the suite
        timer.start()
        for line in self.proc.stderr:
            event = json.loads(line)
            if event.get("message") == "listening" and event.get("listener") == "public":
                self.addr = event["addr"]
                break
        timer.cancel()
        assert self.addr, "the gateway did not say where it listens"
        # Keep reading its logs so it never blocks on a full pipe.
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    @property
    def base_url(self):
        return f"http://{self.addr}/v1"

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def serve(tmp_path):
    """Start gateways from config text; every one is stopped at the end."""
    started = []

    def start(yaml):
        served = Served(tmp_path, yaml)
        started.append(served)
        return served

    yield start
    for served in started:
        served.stop()


@pytest.fixture(scope="module")
def own_gateway():
    """A demo gateway for one test module alone: for tests that stop its
    replicas, which the other modules' shared gateway must keep."""
    with demo() as gw:
        yield gw


@pytest.fixture(scope="session")
def authed_gateway(tmp_path_factory):
    """`infergate serve --config` with API keys required, one simulated
    replica, and a key made by `infergate keys new` (tenant `sdk`) as
    `.key`."""
    made = subprocess.run(
        [BINARY, "keys", "new", "--tenant", "sdk"], capture_output=True, text=True, check=True
    )
    key, line = made.stdout.splitlines()[:2]
    served = Served(
        tmp_path_factory.mktemp("authed"),
        f"""apiVersion: infergate.dev/v1alpha1
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
""",
    )
    served.key = key
    yield served
    served.stop()
