"""The recorder's wing: what a ``Recorder`` is made of on the Python side (the Rust side
is ``crates/hostfeed-core/src/record/``, reached through ``hostfeed._receiver``).

- :mod:`.recorder`: :class:`~.recorder.Recorder` itself, in layers: :mod:`.options` (its
  arguments, checked once), :mod:`.lifetime` (open, flush, close; the open recorders),
  :mod:`.recording` (record, step, watch, keep, triggers); :mod:`.barrier`: what
  ``barrier_wait`` and exit do with the open recorders;
- :mod:`.window`, :mod:`.watch` and :mod:`.triggers`: the flight recorder (the window of
  the last steps, kept by the Rust core, and the triggers that write it: ``keep=``,
  ``on_trigger``, ``Recorder.watch`` and ``hostfeed.spike``, the triggers passed between
  the processes of a distributed run);
- :mod:`.inputs`: the checks of what ``record`` is given;
- :mod:`.roles`: what each operand of a record is after transformations, and the kinds
  and metadata names of records; :mod:`.layout`: one record's layout (its roles, lanes
  and declared arrays), worked out in one place;
- :mod:`.selection` and :mod:`.summaries`: records at selected steps, and summaries
  computed on the device instead of the value; :mod:`.plain`: the plain record, which
  binds a record with its ``RecordSpec`` (the end of a record's road in Python);
- :mod:`.catalogue`: :class:`~.catalogue.Catalogue`, what the lowering, targets and steps
  ask of a recorder (a record's spec carries it); :mod:`.target`:
  :class:`~.target.Target`, a record's host function on the paths through Python;
- :mod:`.lowering`: the recorder's side of lowering (``hostfeed._src.lowering``'s rule for
  a ``RecordSpec``: where a record goes, the consumer that takes its messages), and
  :mod:`.parted`: the lowering of a record written part by part;
- :mod:`.hoist` and :mod:`.step`: ``Recorder.step(fn)``, records taken out of a
  computation as its outputs and appended while the next steps run;
- :mod:`.stores` and :mod:`.coordination`: where a recording lives (paths, object
  stores) and how the processes of a distributed run agree on one store;
- :mod:`.unflushed`: the warning for a read of rows a writer may not have written yet;
- :mod:`.late`: rows that reached a closed recorder, raised by the next ``barrier_wait``
  or reported at exit.
- :mod:`.view`: what ``unflushed`` reads of a recorder (a protocol, so that it does not
  import :mod:`.recorder`).

Reading a recording back is :mod:`hostfeed._src.readback`'s.
"""
