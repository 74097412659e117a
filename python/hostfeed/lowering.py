"""Kept for one release: ``hostfeed.lowering.cuda_status()`` and ``rocm_status()`` are
:func:`hostfeed.gpu_status` (``hostfeed.gpu_status("cuda")``)."""
from __future__ import annotations

from typing import Optional

from . import gpu_status


def cuda_status() -> Optional[str]:
    """``hostfeed.gpu_status("cuda")``.

    Example:
        >>> from hostfeed import lowering
        >>> lowering.cuda_status() is None or "CUDA" in lowering.cuda_status()
        True
    """
    return gpu_status("cuda")


def rocm_status() -> Optional[str]:
    """``hostfeed.gpu_status("rocm")``.

    Example:
        >>> from hostfeed import lowering
        >>> lowering.rocm_status() is None or "ROCM" in lowering.rocm_status()
        True
    """
    return gpu_status("rocm")
