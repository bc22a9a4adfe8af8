"""`radixflow serve` as a real process: SIGTERM drains in-flight work (new requests get 503), then
the process exits 0; at --drain-timeout what still runs is cut with an error event."""

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


def _serve(tmp_path, *flags: str) -> tuple[subprocess.Popen, str, object]:
    """`radixflow serve` in a process, healthy: (process, base URL, its log file)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "radixflow.cli", "serve", "--model", "tiny-qwen3",
                             "--port", str(port), "--kv-cache-memory", "32MiB", "--torch-threads", "1",
                             "--log-level", "warning", *flags],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    end = time.monotonic() + 120
    while True:
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url, log
        except httpx.TransportError:
            pass
        assert time.monotonic() < end, "server did not become healthy"
        time.sleep(0.2)


def _stream_started(url: str, body: dict) -> tuple[threading.Thread, list[str]]:
    """Streams `body` in a thread; returns once the first event arrived, with the list it keeps filling."""
    events: list[str] = []
    started = threading.Event()

    def stream() -> None:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    started.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(60)
    return t, events


def test_sigterm_drains_then_exits(tmp_path):
    proc, url, log = _serve(tmp_path, "--max-model-len", "1024")
    try:
        body = {"prompt": "drain me", "max_tokens": 600, "ignore_eos": True, "stream": True}
        t, events = _stream_started(url, body)
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


def test_drain_timeout_is_applied_once_and_cut_streams_get_an_error_event(tmp_path):
    drain = 3.0
    proc, url, log = _serve(tmp_path, "--max-model-len", "8192", "--drain-timeout", str(drain))
    try:
        # far longer than the drain: 8000 tokens
        body = {"prompt": "never finishes", "max_tokens": 8000, "ignore_eos": True, "stream": True}
        t, events = _stream_started(url, body)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        took = time.monotonic() - t0
        t.join(30)
        # once, not twice (uvicorn's graceful wait used to add another --drain-timeout)
        print(f"\nSIGTERM to exit: {took:.2f} s with --drain-timeout {drain:g}")
        assert drain <= took < 2 * drain - 0.5, took
        assert events[-1] == "[DONE]"
        err = json.loads(events[-2])["error"]
        assert err["code"] == "drain_timeout" and "--drain-timeout 3 s" in err["message"]
        assert len(events) > 3  # tokens had been streaming before the cut
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
