"""Reading a recording back, with no recorder involved: :func:`~.reading.read_recording`
(one array as numpy), :func:`~.opened.open_recording` and :func:`~.opened.follow` (random
access, batches, and the rows of a store that is still being written),
``python -m hostfeed show`` (:mod:`.show`: a whole recording drawn, :mod:`.grid` and
:mod:`.draw`, from the statistics of :mod:`.series`) and the TensorBoard export
(:mod:`.tensorboard`). Stores are named as the recorder names them
(:mod:`hostfeed._src.record.stores`)."""
