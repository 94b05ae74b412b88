"""The sidecar's own bugs: a class of their own, never taken for a tool's fault.

A connection asked to do what its state table does not allow, or a retry machine given an
event out of turn, is a fault in the sidecar's code. It is not retried as the tool's reset
(which would hide it and repeat the call): it ends the request with ``SIDECAR_ERROR``
(500), logged with its traceback.
"""

from __future__ import annotations


class SidecarBug(Exception):
    """The sidecar's code did what its own rules do not allow."""
