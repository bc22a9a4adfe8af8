"""`radixflow serve` as a real process whose whole output the test keeps.

The server binds `--port 0` (the kernel picks a free port: no race) and the test learns the port
and readiness from the lines the server prints: uvicorn's "Uvicorn running on ..." and the engine
thread's "model ... loaded: ready" (both at the default log level, info). A reader thread keeps
every line, so a test can search the server's complete stdout and stderr after it exits.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

_RUNNING = re.compile(r"Uvicorn running on (https?)://([0-9.]+):(\d+)")
_START_S = 120  # generous: only a hung or crashed server waits this long


class ServeProcess:
    def __init__(self, *flags: str, model: str = "tiny-qwen3", env: dict[str, str] | None = None) -> None:
        base = {k: v for k, v in os.environ.items() if k != "RADIXFLOW_API_KEY"}  # only what the test says
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "radixflow.cli", "serve", "--model", model, "--port", "0",
             "--kv-cache-memory", "32MiB", "--torch-threads", "1", *flags],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
            env={**base, "PYTHONUNBUFFERED": "1", **(env or {})})
        self.lines: list[str] = []
        self.url: str | None = None
        self._running, self._ready, self._ended = threading.Event(), threading.Event(), threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            m = _RUNNING.search(line)
            if m:
                host = "127.0.0.1" if m.group(2) == "0.0.0.0" else m.group(2)  # all interfaces: reach it here
                self.url = f"{m.group(1)}://{host}:{m.group(3)}"
                self._running.set()
            if "loaded: ready" in line:
                self._ready.set()
        self._ended.set()

    def wait_ready(self) -> str:
        """The base URL once uvicorn listens and the model is loaded; fails with the output if the
        process ends first."""
        for ev in (self._running, self._ready):
            for _ in range(_START_S):  # one-second waits on the event, so that an exit ends the wait
                if ev.wait(1):
                    break
                assert not self._ended.is_set(), "the server exited:\n" + self.output
            else:
                raise AssertionError(f"the server was not ready after {_START_S} s:\n{self.output}")
        return self.url

    def stop(self) -> str:
        """SIGTERM, wait for exit 0, return everything the server printed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(_START_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._ended.wait(_START_S)
        assert code == 0, self.output
        return self.output

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
