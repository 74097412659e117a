"""The stall watch of the receiver's dispatcher: it has a call held back behind an
incomplete joined (global-view) callback run out of its device's order only once it has
established that the part the callback waits for can never come while the call waits: a
circle that runs through JAX's CPU runtime, where the dispatcher cannot see it.

The circle: on CPU, a device that waits for a call (or a synchronous tap) holds up its
later executions, which fill the device's in-flight semaphore; the launches of
multi-device executions that need the device then wait for that semaphore on threads of
the runtime's pool, and executions waiting for held calls occupy its other threads; the
part the held device waits for then never gets a thread to run on. Everything waits, and
what it waits for is the call held back here. A device that is merely busy (a long
computation, a slow host callback) is not in a circle: its part comes once it is done,
however long that takes, and its call must wait.

So the watch does not go by how long nothing came. While a device is held, it samples
what the process does, in windows of :data:`WINDOW` seconds: the messages that reach the
receiver, the CPU time the process uses, and whether any thread is inside a JAX host
callback (``pure_callback``, ``io_callback``, ``debug.callback``, ``buffer_callback``: a
function that may take any time without using the CPU). A busy device shows in every
window (it computes, or its callback runs). Only when :data:`QUIET_WINDOWS` windows in a
row show nothing at all (no message, almost no CPU time, no callback: every thread of the
process waits) is the circle established; then it has the consumer thread check, in queue
order, that still nothing came, and run the held call (``Dispatcher._unstall``, which does
so only for CPU devices of a process that runs alone: a device that waits for an
accelerator or for another process also leaves this process idle, and is no circle).

A thread of its own, started when a call is first held back; it waits on an event while
no device is held.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from .. import _receiver
from .consumers import Consumer, ConsumerKind

#: Seconds of each sample of what the process does while a device is held.
WINDOW = 0.5
#: How many windows in a row must show a process that does nothing (no message reaches the
#: receiver, no CPU time, no host callback running) before a held call runs out of order.
QUIET_WINDOWS = 2
#: CPU time (as a fraction of one core over a window) below which the process is idle: a
#: busy device uses a whole core; a process whose threads all wait uses next to nothing.
IDLE_CPU = 0.02

#: hostfeed's own Python code: a thread whose innermost frame is here waits for the
#: receiver (a portable call waiting for its reply, a tap pushed onto a full queue) or is
#: the receiver itself.
_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: The modules of JAX's host callbacks: a thread with one of them on its stack runs one.
_JAX_CALLBACKS = tuple(os.sep + os.path.join("jax", "_src", name)
                       for name in ("callback.py", "debugging.py", "buffer_callback.py"))


class Activity(NamedTuple):
    """What the process did up to a moment: messages enqueued, CPU seconds used, and
    whether a JAX host callback runs now."""

    enqueued: int
    cpu: float
    callback: bool


def in_jax_callback(frames: dict | None = None) -> bool:
    """Whether a thread (other than the calling one) runs a JAX host callback now: a JAX
    callback module on its stack and its innermost frame not hostfeed's.

    Example:
        >>> in_jax_callback()
        False
    """
    me = threading.get_ident()
    for ident, innermost in (sys._current_frames() if frames is None else frames).items():
        if ident == me or innermost.f_code.co_filename.startswith(_OWN):
            continue
        frame = innermost
        while frame is not None:
            if frame.f_code.co_filename.endswith(_JAX_CALLBACKS):
                return True
            frame = frame.f_back
    return False


def activity() -> Activity:
    """What the process did so far (:class:`Activity`)."""
    return Activity(_receiver.host.stats()["messages_enqueued"], time.process_time(),
                    in_jax_callback())


class StallWatch:
    """Calls ``unstall(n)`` on the consumer thread, in queue order, once ``held()`` (read
    from the watch's thread) stayed true while ``quiet`` windows of ``window`` seconds in a
    row showed a process that did nothing (``sample()``: no message enqueued, less than
    :data:`IDLE_CPU` of a core, no host callback running at either end of a window); ``n``
    is the count of messages enqueued with that check's own, so that ``unstall`` can tell
    whether anything came since.

    Example:
        >>> watch = StallWatch(lambda: False, lambda n: None)
        >>> watch.thread is None
        True
    """

    def __init__(self, held: Callable[[], bool], unstall: Callable[[int], None],
                 window: float = WINDOW, quiet: int = QUIET_WINDOWS,
                 sample: Callable[[], Activity] = activity) -> None:
        self.held = held
        self.unstall = unstall
        self.window = window
        self.quiet = quiet
        self.sample = sample
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

    def idle(self, before: Activity, after: Activity) -> bool:
        """Whether the process did nothing between two samples."""
        return (after.enqueued == before.enqueued and not before.callback
                and not after.callback and after.cpu - before.cpu < IDLE_CPU * self.window)

    def _run(self) -> None:
        pause = threading.Event()  # never set: a timed wait
        while True:
            self.wake.wait()
            self.wake.clear()
            quiet = 0
            while self.held():
                try:
                    before = self.sample()
                    pause.wait(self.window)
                    after = self.sample()
                    # (Also while the receiver is stopped, as by a stop from another
                    # thread: the check, like any message, starts a consumer.)
                    if not self.held() or not self.idle(before, after):
                        quiet = 0
                        continue
                    quiet += 1
                    if quiet < self.quiet:
                        continue
                    quiet = 0
                    self._check(after.enqueued + 1, pause)
                except Exception:  # noqa: BLE001 - the receiver shut down (exit)
                    return

    def _check(self, n: int, pause: threading.Event) -> None:
        """Pushes the check (``unstall(n)`` on the consumer thread, in queue order) and
        waits until it ran (or nothing is held any more, or the receiver stopped): one
        check at a time, each after windows sampled since the last."""
        ran = threading.Event()

        def check(arrays: object, ordinal: int) -> None:
            try:
                self.unstall(n)
            finally:
                ran.set()

        _receiver.host.push_eager(Consumer(check, "stall check", ConsumerKind.TAP), (), 0)
        while not ran.is_set() and self.held() and _receiver.host.is_running():
            pause.wait(self.window)  # (a stopped receiver runs it when it starts again)
