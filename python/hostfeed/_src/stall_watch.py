"""The stall watch of the receiver's dispatcher: when devices wait for calls held back
behind incomplete joined (global-view) callbacks and nothing at all reaches the receiver
for :data:`PATIENCE` seconds, it has the consumer thread check for such a call and run it
out of its device's order (``Dispatcher._unstall``).

The dispatcher finds a circle of held devices that wait for each other as soon as it
forms, but not one that runs through the runtime: on CPU, a device that waits for a call
holds up its later executions, which fill the device's in-flight semaphore, and then the
launches of multi-device executions on every device (the launch threads and the threads
that dispatch them wait for that semaphore), so the part a held device waits for may
never be launched. Nothing then reaches the receiver any more, which is what this
watches for. A thread of its own, started when a call is first held back; it waits on an
event while no device is held.
"""
from __future__ import annotations

import threading
from collections.abc import Callable

from .. import _receiver
from .consumers import Consumer, ConsumerKind

#: Seconds without any message reaching the receiver, while devices are held, after which
#: a call held back behind an incomplete joined callback runs out of its device's order.
PATIENCE = 2.0


class StallWatch:
    """Calls ``unstall(n)`` on the consumer thread, in queue order, once ``held()`` (read
    from the watch's thread) stayed true and no message was enqueued for ``patience``
    seconds; ``n`` is the count of messages enqueued with that check's own, so that
    ``unstall`` can tell whether anything came since.

    Example:
        >>> watch = StallWatch(lambda: False, lambda n: None)
        >>> watch.thread is None
        True
    """

    def __init__(self, held: Callable[[], bool], unstall: Callable[[int], None],
                 patience: float = PATIENCE) -> None:
        self.held = held
        self.unstall = unstall
        self.patience = patience
        self.wake = threading.Event()
        self.thread: threading.Thread | None = None

    def note(self) -> None:
        """(The consumer thread.) A message that its device waits for was held back.
        No lock (the consumer thread calls it; two threads started by an abandoned
        consumer and its successor would only check twice), so none to reset after a fork,
        where the thread is gone and starts again."""
        self.wake.set()
        t = self.thread
        if t is None or not t.is_alive():
            self.thread = threading.Thread(target=self._run, daemon=True,
                                           name="hostfeed-stall-watch")
            self.thread.start()

    def _run(self) -> None:
        pause = threading.Event()  # never set: a timed wait
        while True:
            self.wake.wait()
            self.wake.clear()
            while self.held():
                try:
                    seen = _receiver.host.stats()["messages_enqueued"]
                    pause.wait(self.patience)
                    if (not self.held() or not _receiver.host.is_running()
                            or _receiver.host.stats()["messages_enqueued"] != seen):
                        continue
                    check = Consumer(lambda arrays, ordinal, n=seen + 1: self.unstall(n),
                                     "stall check", ConsumerKind.TAP)
                    _receiver.host.push_eager(check, (), 0)
                except Exception:  # noqa: BLE001 - the receiver shut down (exit)
                    return
