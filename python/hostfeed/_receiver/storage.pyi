"""``hostfeed._receiver.storage``: the storage back-ends' store schemes, lock and a store
opened at a root (``storage.rs``).
"""

from typing import Final, final

__all__ = [
    "STORE_SCHEMES", "LOCK_FILE", "is_object_url", "store_held", "StorageLock", "Storage",
]

#: The URL schemes of the stores that URLs name (lowercase, without ``://``).
STORE_SCHEMES: Final[list[str]]
#: The name of an open store's lock (file or object) in its root.
LOCK_FILE: Final[str]

def is_object_url(url: str) -> bool:
    """Whether ``url`` names a store of a back-end that URLs name (``s3://``, ``gs://``,
    ``az://`` and their aliases, ``memory://``)."""

def store_held(path: str, *, url: bool = False,
               storage_options: list[tuple[str, str]] | None = None) -> bool:
    """Whether a recorder holds the store now (read only; unreadable: False)."""

@final
class StorageLock:
    """A lock that ``Storage.lock`` took."""

    def release(self) -> None:
        """Releases the lock (again: nothing)."""

@final
class Storage:
    """A store's back-end opened at a root: objects by key below it, and its lock."""

    def __new__(cls, path: str, *, url: bool = False,
                storage_options: list[tuple[str, str]] | None = None) -> Storage: ...
    @property
    def root(self) -> str:
        """The store's root (a path, or the URL)."""

    def put(self, key: str, data: bytes) -> None:
        """Stores ``data`` as the whole object ``key``, replacing any object there."""

    def get(self, key: str) -> bytes:
        """The bytes of object ``key``."""

    def get_range(self, key: str, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive) of object ``key``, read alone."""

    def list(self, key: str = "") -> list[str]:
        """The names directly below ``key`` (``""``: the root), sorted."""

    def remove(self, key: str) -> None:
        """Removes object ``key``, or everything below it."""

    def lock(self, lease: float = 60.0) -> StorageLock:
        """Takes the store's lock as a recorder does (``RecordingError`` while another
        holds it)."""

    def is_held(self) -> bool:
        """Whether a recorder holds the store now (read only)."""
