"""Read a download ahead of its consumer, so receiving, hashing and writing overlap.

A large file's ingest has three costs per byte: taking it off the socket (the HTTP client's
parsing holds the GIL), hashing it and writing it (both release the GIL). Done in one thread they
take turns; with the read in a thread of its own (and the store's writes in another, see
`kerneld.store.blobs`) they run at once on a multi-core host. The queue between reader and
consumer is bounded, so memory stays at `depth` chunks whatever the file's size.

Nothing about verification moves: the consumer still hashes and writes every byte in order, and
an error the reader hits is raised in the consumer after every chunk that came before it, so a
resume offset, a size check or a digest check sees exactly what it did without the thread.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import cast

#: Chunks held between the reader and the consumer (the HTTP upstream's are 1 MiB): enough to
#: ride out the consumer's pauses (the store's periodic fdatasync), small against a variant's
#: files downloading side by side.
DEPTH = 4


@dataclass(frozen=True)
class _Failed:
    error: BaseException


_END = object()


class ReadAhead:
    """Runs `open_stream()` (a context manager yielding an iterator of chunks) in a thread and
    yields its chunks to the caller; leaving the `with` block stops the reader and closes the
    stream (in the reader's thread: the stream is only ever touched by one thread)."""

    def __init__(
        self,
        open_stream: Callable[[], AbstractContextManager[Iterator[bytes]]],
        *,
        depth: int = DEPTH,
        name: str = "kerneld-read-ahead",
    ) -> None:
        self._queue: queue.Queue[object] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        # The caller's context (an upstream call's deadline lives in a ContextVar) goes along.
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._run, open_stream), name=name, daemon=True
        )
        self._thread.start()

    def _run(self, open_stream: Callable[[], AbstractContextManager[Iterator[bytes]]]) -> None:
        try:
            with open_stream() as chunks:
                for chunk in chunks:
                    if self._stop.is_set():
                        return
                    self._queue.put(chunk)
        except BaseException as exc:  # handed to the consumer, raised there
            self._queue.put(_Failed(exc))
            return
        self._queue.put(_END)

    def __iter__(self) -> Iterator[bytes]:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield cast(bytes, item)

    def close(self) -> None:
        """Stop the reader and wait for it to close its stream (it finishes at most the chunk
        it is reading: the stream's own timeouts bound that)."""
        self._stop.set()
        while self._thread.is_alive():
            self._drain()  # a reader blocked on a full queue gets room to see the stop
            self._thread.join(0.05)
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
