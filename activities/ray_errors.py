"""What can go wrong when talking to Ray, as typed exceptions.

`retryable` tells a retry policy whether the same call may succeed later: an unreachable
GCS may come back, a dead Raylet, a wrong token or a Ray without the RPC will not.
`activities.cluster` hands the flag to Temporal as `ApplicationError.non_retryable`, so a
class that says False here stops every activity retry policy at once.

| exception            | when                                                  | retryable |
|----------------------|-------------------------------------------------------|-----------|
| RayUnavailable       | unreachable, no answer in time, overloaded, a dropped | yes       |
|                      | stream (UNAVAILABLE, DEADLINE_EXCEEDED,               |           |
|                      | RESOURCE_EXHAUSTED, CANCELLED, INTERNAL, UNKNOWN)     |           |
| RayletNotFound       | the Raylet is dead or unknown                         | no        |
| RayInvalidArgument   | the request is wrong                                  | no        |
| RayUnauthenticated   | no token, or a wrong one                              | no        |
| RayPermissionDenied  | the token is known but not allowed this call          | no        |
| RayAuthUnavailable   | the cluster's own token could not be read (its Secret | no; yes   |
|                      | refused, missing, without the key); yes when the      | when the  |
|                      | Kubernetes API was unreachable                        | API was   |
| RayUnsupported       | this Ray does not have the RPC (UNIMPLEMENTED)        | no        |
| RayRefused           | Ray refused with a status raysize does not know       | no        |
| RayReplyError        | an unreadable reply, or a gRPC code Ray never sends   | no        |
"""

from __future__ import annotations


class RayError(Exception):
    """A call to Ray failed. `retryable`: trying the same call again may succeed.

    Only the subclasses are raised; the base says False so that a failure nobody
    classified is never retried for ever.
    """

    retryable: bool = False


class RayUnavailable(RayError):
    """The GCS or the Raylet could not be reached, did not answer in time, or the call
    was cut short on the way (overload, a dropped stream)."""

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


class RayPermissionDenied(RayUnauthenticated):
    """The token was recognised but may not make this call. A credentials problem like
    `RayUnauthenticated`, and reported to the workflows as one."""

    retryable = False


class RayAuthUnavailable(RayError):
    """The cluster's own token could not be read (`activities/ray_tokens.py`): its
    Secret refused (RBAC), missing, or without the key. Reported to the workflows as a
    credentials problem (`Err.RAY_AUTH`) unless the API server was only unreachable."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class RayUnsupported(RayError):
    """The Ray at the address does not serve the RPC: an older Ray, or not a Ray GCS."""

    retryable = False


class RayRefused(RayError):
    """Ray refused the call with a status raysize does not know how to handle."""

    retryable = False


class RayReplyError(RayError):
    """Ray answered with something raysize cannot read: an incompatible Ray version, or
    something other than a Ray GCS at the address."""

    retryable = False
