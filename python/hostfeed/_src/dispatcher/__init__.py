"""The dispatcher: what the Rust consumer thread calls with each message it does not run
itself, keeping each device's messages in its program order around joined (global-view,
shard by shard) taps and calls. Its concerns, one module each:

- :mod:`.delivery` (:class:`Dispatcher`): a message delivered to its consumer (a tap, a
  call, a part of a joined set), and what the receiver holds of the dispatcher
  (:meth:`Dispatcher.state`: the typed ``DispatcherState``, the ``Holds`` both languages
  share);
- :mod:`.holding` (:class:`Holding`): the ordering: devices held while their joined set
  is incomplete, their later messages held back (charged against the queue's bound) and
  run in order once it completes; the messages an abandoned consumer left;
- :mod:`.crossings` (:class:`Crossings`): circles of held devices that wait for each
  other, broken by running one message out of its device's order (and, once the stall
  watch established a circle through the runtime, ``unstall``);
- :mod:`.failures` (:class:`Failures`): the executions known to have failed, the
  barriers' marks and sweeps, the sets they drop.

Each device's messages must reach the host in that device's program order, and a joined
tap counts as happening at its position on every device that sent a part. So once a
device has sent a part whose set is incomplete, the device is *held*: its later messages,
of whatever execution, wait until the set completes (then they run, in order). Messages
of other devices go on. A barrier waits for messages held back as for any other (the
receiver counts each as not run until it ran, by its sequence number, ``Message.seq``),
even when the set's other parts come from an execution dispatched after the barrier
started. Messages held back count against the queue's byte bound (up to half of it, so
that the pushes that complete the sets always find room; past that they are kept
uncharged, with a warning), and a push is admitted whenever nothing but held-back
messages is charged. A device going on to other executions is normal (a multi-device
execution is not ordered against single-device ones, nor are executions dispatched by
different threads), so it never drops a set.

A set is dropped only when its execution is known to have failed, never because time
passed or because a barrier ran meanwhile (:mod:`.failures`).

Only the consumer thread runs the dispatcher, so it takes no lock: state changes and
callbacks interleave freely. The one exception is a consumer that was abandoned while
stuck in a callback and comes back later: it notices that it no longer owns the
dispatcher and leaves the messages it was releasing to the current consumer (the
``Holds``' orphans), which runs them first, in order.
"""
from __future__ import annotations

from .delivery import UNKNOWN_RUN, Dispatcher, run_sync_tap

__all__ = ["Dispatcher", "UNKNOWN_RUN", "dispatcher", "run_sync_tap"]

#: The dispatcher of the receiver's consumer thread (held messages charged to the bound).
dispatcher = Dispatcher(charge=True, watch=True)
