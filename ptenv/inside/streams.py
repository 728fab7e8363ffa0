"""A model process's output streams as the supervisor reads them: the first bytes kept up to a cap,
the rest counted, and past the cap read only at a pace, so a flood's writer waits on its own full
pipe instead of spending CPU, its own and its supervisor's (F11)."""

import os
import time

PACE = 0.004  # seconds between reads of a stream past its cap: 64 KiB each, 16 MiB/s


class Capture:
    """Keeps the first `cap` bytes of a stream and counts the rest."""

    def __init__(self, cap: int):
        self.cap = cap
        self.head = bytearray()
        self.total = 0
        self.next_read = 0.0  # past the cap, the stream is paced (read_paced)

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.cap - len(self.head)
        if room > 0:
            self.head += data[:room]

    def text(self) -> str:
        return self.head.decode("utf-8", "replace")

    def with_notice(self) -> str:
        return self.text() + f"\n[... {self.cut} more bytes cut]" if self.cut else self.text()

    @property
    def cut(self) -> int:
        return self.total - len(self.head)


def read_available(fd: int, sink: Capture, blocks: int = 64) -> None:
    """Read what is in a non-blocking pipe now; bounded, as a background writer may never stop."""
    for _ in range(blocks):
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return
        if not data:
            return
        sink.feed(data)


def read_paced(fd: int, sink: Capture) -> None:
    """read_available while a process runs; past its cap a stream is read one block per PACE."""
    if time.monotonic() < sink.next_read:
        return
    read_available(fd, sink, 1 if sink.cut else 64)
    if sink.cut:
        sink.next_read = time.monotonic() + PACE


def paced(streams: dict[int, Capture], idle: float) -> tuple[list[int], float]:
    """The streams to wait on now, and how soon a paced one may be read again (`idle` if none is paced)."""
    now = time.monotonic()
    waits = [sink.next_read - now for sink in streams.values() if sink.next_read > now]
    return [fd for fd, sink in streams.items() if sink.next_read <= now], min(waits, default=idle)
