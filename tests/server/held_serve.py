"""`radixflow serve` in this process with the harness's `HeldLoop` as the server's engine loop, so a
test can hold a real server process's engine (tests/server/test_server_shutdown.py).

    python held_serve.py serve --model tiny-qwen3 --port 0 ...

runs `radixflow serve ...` unchanged (its signals, drain and exit status included). Stdin drives
the loop, one command a line: `hold N` (N more rounds, then none until `release`) answers
`hold armed` once the loaded engine took it; `release` answers `released`.
"""

from __future__ import annotations

import sys
import threading

from server_harness import HeldLoop

from radixflow import cli
from radixflow.server import app

_made = threading.Event()
_loops: list[HeldLoop] = []


def _held_loop(*args, **kwargs) -> HeldLoop:
    _loops.append(HeldLoop(*args, **kwargs))
    _made.set()
    return _loops[-1]


def _control() -> None:
    for line in sys.stdin:
        word, *arg = line.split()
        _made.wait()
        if word == "hold":
            _loops[0].hold(int(arg[0]))
            print("hold armed", flush=True)
        elif word == "release":
            _loops[0].release()
            print("released", flush=True)
        else:
            print(f"held_serve: unknown command {line.strip()!r}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    app.EngineLoop = _held_loop
    threading.Thread(target=_control, name="held-serve-control", daemon=True).start()
    sys.exit(cli.main(sys.argv[1:]))
