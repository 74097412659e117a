"""hostfeed's internals: nothing here is API (the API is ``hostfeed`` and
``hostfeed.host_callback``). ARCHITECTURE.md ("Where things live") maps the modules, from the
ground floor (``settings``, ``compat``, ``dtypes``, ``devices``, ``errors``) up through the
receiver (``consumers``, ``dispatcher``, ``lifecycle``), the primitives and their rules, the
transports, placement and lowering, to the recorder."""
