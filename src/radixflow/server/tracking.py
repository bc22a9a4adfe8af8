"""One HTTP request's life in the engine, seen from its handler: submit, events, abort on exit.

A handler that leaves before the engine finished (client gone, stream cancelled, error) aborts the
request; the abort runs on the engine thread between rounds and frees its pages and snapshots.
"""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import Request

from radixflow.core.branch import Branch
from radixflow.server.engine_loop import EngineLoop, Event, Failed, Finished, Submission


class ClientGone(Exception):
    """The client closed the connection while waiting."""


class TrackedRequest:
    def __init__(self, loop: EngineLoop, request: Request, request_id: str, branches: list[Branch],
                 stream: bool) -> None:
        aloop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[Event] = asyncio.Queue()
        self._loop = loop
        self._request = request
        self.request_id = request_id
        self.branches = branches
        self.done = False
        self._watch: asyncio.Task | None = None
        self._sub = Submission(request_id, branches,
                               lambda ev: aloop.call_soon_threadsafe(self._queue.put_nowait, ev), stream)
        loop.submit(self._sub)  # raises 429 / 503 before anything is sent

    async def next(self, watch_disconnect: bool = True) -> Event:
        """The next event; raises ClientGone if the client disconnects first."""
        get = asyncio.ensure_future(self._queue.get())
        waits = {get}
        if watch_disconnect:
            if self._watch is None:
                self._watch = asyncio.ensure_future(_wait_disconnect(self._request))
            waits.add(self._watch)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled (Starlette saw the disconnect): leave no task behind
            get.cancel()
            raise
        if not get.done():
            get.cancel()
            raise ClientGone()
        ev = get.result()
        if isinstance(ev, Finished | Failed):
            self.done = True
        return ev

    def close(self) -> None:
        """Aborts the request in the engine unless it already ended; idempotent."""
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if not self.done:
            self.done = True
            self._loop.abort(self.request_id)


async def _wait_disconnect(request: Request) -> None:
    with contextlib.suppress(Exception):
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return
