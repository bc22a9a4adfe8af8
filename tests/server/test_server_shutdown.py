"""`radixflow serve` as a real process: SIGTERM drains in-flight work (new requests get 503), then
the process exits 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
from server_harness import free_port


def test_sigterm_drains_then_exits(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "radixflow.cli", "serve", "--model", "tiny-qwen3",
                             "--port", str(port), "--kv-cache-memory", "32MiB", "--max-model-len", "1024",
                             "--torch-threads", "1", "--log-level", "warning"],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        end = time.monotonic() + 120
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < end, "server did not become healthy"
            time.sleep(0.2)

        events: list[str] = []
        started = threading.Event()

        def stream() -> None:
            body = {"prompt": "drain me", "max_tokens": 600, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        started.set()

        t = threading.Thread(target=stream)
        t.start()
        assert started.wait(60)
        proc.send_signal(signal.SIGTERM)
        refused = None
        for _ in range(100):  # the signal is handled on the server's next tick
            r = httpx.post(url + "/v1/completions", json={"prompt": "late", "max_tokens": 1}, timeout=30)
            if r.status_code == 503:
                refused = r.json()["error"]
                break
            time.sleep(0.02)
        assert refused is not None and refused["code"] == "draining", refused
        t.join(120)
        assert events[-1] == "[DONE]"
        last = json.loads(events[-2])
        assert last["choices"][0]["finish_reason"] == "length"  # ran to the end, not aborted
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
