"""Reading a recording back, with no recorder involved: :func:`~.reading.read_recording`
(one array as numpy), :func:`~.opened.open_recording` and :func:`~.opened.follow` (random
access, batches, and the rows of a store that is still being written), and
``python -m hostfeed show`` (:mod:`.show`). Stores are named as the recorder names them
(:mod:`hostfeed._src.record.stores`)."""
