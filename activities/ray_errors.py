"""What can go wrong when talking to Ray, as typed exceptions.

`retryable` tells a retry policy whether the same call may succeed later: an unreachable
GCS may come back, a dead Raylet or a wrong token will not.
"""

from __future__ import annotations


class RayError(Exception):
    """A call to Ray failed. `retryable`: trying the same call again may succeed."""

    retryable: bool = True


class RayUnavailable(RayError):
    """The GCS or the Raylet could not be reached, or did not answer in time."""

    retryable = True


class RayletNotFound(RayError):
    """The Raylet is dead or was never known to the GCS."""

    retryable = False


class RayInvalidArgument(RayError):
    """The request is wrong; refused by raysize before sending, or by Ray."""

    retryable = False


class RayUnauthenticated(RayError):
    """The cluster requires a token and none, or a wrong one, was sent."""

    retryable = False


class RayReplyError(RayError):
    """Ray answered with something raysize cannot read: an incompatible Ray version."""

    retryable = False
