"""Imported first by the package: parses every ``HOSTFEED_*`` and
``JAX_HOST_CALLBACK_*`` variable (:func:`hostfeed.settings.validate`), so that a bad value
fails ``import hostfeed`` with a ``ValueError`` naming the variable."""
from . import settings

settings.validate()
