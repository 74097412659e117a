"""Where a recording lives. Today a local or shared file system: a path (``str``,
``bytes``, ``os.PathLike``) or a ``file://`` URL on this host; a URL of any other scheme
is refused at the call rather than taken for a local folder name."""
from __future__ import annotations

import os
import re
import urllib.parse
import urllib.request
from typing import Any

_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")


def local_path(path: Any) -> str:
    """A store path as ``str``: ``os.fspath`` (``str``, ``bytes`` decoded with the file
    system encoding, or any ``os.PathLike``); a ``file://`` URL as its path. Any other URL
    is refused (it would otherwise name a local folder such as ``./s3:/bucket``).

    Example:
        >>> local_path("file:///tmp/run.zarr")
        '/tmp/run.zarr'
        >>> local_path("s3://bucket/run.zarr")
        Traceback (most recent call last):
        ...
        ValueError: hostfeed: Recorder('s3://bucket/run.zarr'): s3:// stores are not supported...
    """
    try:
        p = os.fspath(path)
    except TypeError:
        raise TypeError(f"hostfeed: Recorder(path) needs a str, bytes or os.PathLike, got "
                        f"{type(path).__name__}") from None
    text = os.fsdecode(p) if isinstance(p, bytes) else p
    url = _URL.match(text)
    if url is None:
        return text
    scheme = url.group(1).lower()
    parsed = urllib.parse.urlparse(text)
    if scheme == "file" and parsed.netloc in ("", "localhost"):
        return urllib.request.url2pathname(parsed.path)
    raise ValueError(
        f"hostfeed: Recorder({text!r}): {scheme}:// stores are not supported yet; the "
        f"Recorder writes to a local or shared file system (a path, or a file:// URL on "
        f"this host). Record to a local path and copy the store afterwards (it is a folder "
        f"of files), or, for a local folder whose name looks like a URL, write "
        f"'./{text}'.")
