"""The recorder's wing: what a ``Recorder`` is made of on the Python side.

- :mod:`.hoist`: records taken out of a computation as its outputs (an interpreter over the
  traced jaxpr that rebuilds scans and conds around them);
- :mod:`.step`: ``Recorder.step(fn)``, the jitted step whose recorded outputs are copied to
  the host while the next steps run, and the pipeline that appends their rows.
"""
