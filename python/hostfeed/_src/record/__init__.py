"""The recorder's wing: what a ``Recorder`` is made of on the Python side (the Rust side
is ``crates/hostfeed-core/src/record/``, reached through ``hostfeed._receiver``).

- :mod:`.recorder`: :class:`~.recorder.Recorder` itself (open, record, step, flush, close);
  :mod:`.barrier`: what ``barrier_wait`` and exit do with the open recorders;
- :mod:`.window`, :mod:`.watch` and :mod:`.triggers`: the flight recorder (the window of
  the last steps, kept by the Rust core, and the triggers that write it: ``keep=``,
  ``on_trigger``, ``Recorder.watch`` and ``hostfeed.spike``, the triggers passed between
  the processes of a distributed run);
- :mod:`.inputs`: the checks of what ``record`` is given;
- :mod:`.roles`: what each operand of a record is after transformations, and the kinds
  and metadata names of records; :mod:`.layout`: one record's layout (its roles, lanes
  and declared arrays), worked out in one place;
- :mod:`.target`: :class:`~.target.Target`, one name of one recorder: what a record's
  callback is, and what the lowering asks of it;
- :mod:`.lowering`: the recorder's side of lowering (``hostfeed._src.lowering`` asks it
  whether a tap is a record, and for the consumer that takes its messages), and
  :mod:`.parted`: the lowering of a record written part by part;
- :mod:`.selection` and :mod:`.summaries`: records at selected steps, and summaries
  computed on the device instead of the value;
- :mod:`.hoist` and :mod:`.step`: ``Recorder.step(fn)``, records taken out of a
  computation as its outputs and appended while the next steps run;
- :mod:`.stores` and :mod:`.coordination`: where a recording lives (paths, object
  stores) and how the processes of a distributed run agree on one store;
- :mod:`.unflushed`: the warning for a read of rows a writer may not have written yet;
- :mod:`.late`: rows that reached a closed recorder, raised by the next ``barrier_wait``
  or reported at exit.
- :mod:`.view`: what ``target`` and ``unflushed`` read of a recorder (a protocol, so
  that they do not import :mod:`.recorder`).

Reading a recording back is :mod:`hostfeed._src.readback`'s.
"""
