"""Decoding a core/v1 Event's times as the real API server does.

The server decodes a written Event into its Go type before anything else looks at it:
each time field is parsed (`metav1.Time`: RFC 3339 with any offset; `metav1.MicroTime`,
i.e. `eventTime` and `series.lastObservedTime`: RFC 3339 with exactly six fraction
digits) and written back in UTC with `Z`, so what a client reads is always canonical
(`2026-11-24T04:00:00.123456+00:00` is stored as `2026-11-24T04:00:00Z`, or as
`2026-11-24T04:00:00.123456Z` for a MicroTime). The first field that does not decode,
in the body's order, fails the request with Go's message. Time fields that are not set
are written as `null` (`firstTimestamp`, `lastTimestamp`, `eventTime`,
`series.lastObservedTime`) or left out (the ObjectMeta times), as the server does.
"""

from __future__ import annotations

from typing import Any

from raysize.sandbox.kubetime import TimeParseError, canonical_micro_time, canonical_time

Obj = dict[str, Any]

# field → (the Go struct a type error names, whether it is a MicroTime)
_EVENT_TIMES = {
    "firstTimestamp": ("Event", False),
    "lastTimestamp": ("Event", False),
    "eventTime": ("Event", True),
}
_META_TIMES = ("creationTimestamp", "deletionTimestamp")


class DecodeError(ValueError):
    """The body does not decode into an Event; the message is Go's."""


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "string"


def _time(value: object, struct: str, path: str, micro: bool) -> str | None:
    """One `metav1.Time`/`MicroTime` field's stored form (None for null)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise DecodeError(
            f"json: cannot unmarshal {_json_kind(value)} into Go struct field "
            f"{struct}.{path} of type string"
        )
    try:
        return canonical_micro_time(value) if micro else canonical_time(value)
    except TimeParseError as exc:
        raise DecodeError(str(exc)) from None


def _metadata(meta: Obj) -> None:
    for key in list(meta):
        if key in _META_TIMES:
            stamp = _time(meta[key], "ObjectMeta", f"metadata.{key}", False)
            if stamp is None:
                del meta[key]
            else:
                meta[key] = stamp
        elif key == "managedFields" and isinstance(meta[key], list):
            for entry in meta[key]:
                if isinstance(entry, dict) and "time" in entry:
                    stamp = _time(
                        entry["time"], "ManagedFieldsEntry", "metadata.managedFields.time", False
                    )
                    if stamp is None:
                        del entry["time"]
                    else:
                        entry["time"] = stamp


def _series(series: object) -> Obj | None:
    if series is None:
        return None
    if not isinstance(series, dict):
        raise DecodeError(
            f"json: cannot unmarshal {_json_kind(series)} into Go struct field "
            "Event.series of type v1.EventSeries"
        )
    series["lastObservedTime"] = _time(
        series.get("lastObservedTime"), "EventSeries", "series.lastObservedTime", True
    )
    return series


def decode_event_times(event: Obj) -> None:
    """Canonicalize an Event's times in place, in the body's order; raises DecodeError."""
    for key in list(event):
        if key in _EVENT_TIMES:
            struct, micro = _EVENT_TIMES[key]
            event[key] = _time(event[key], struct, key, micro)
        elif key == "metadata" and isinstance(event[key], dict):
            _metadata(event[key])
        elif key == "series":
            series = _series(event[key])
            if series is None:
                del event[key]
    for key in _EVENT_TIMES:
        event.setdefault(key, None)


def handled_as(message: str) -> str:
    """The create/update decode error: `Event in version "v1" cannot be handled as a
    Event: <Go's error>` (a 400 BadRequest)."""
    return f'Event in version "v1" cannot be handled as a Event: {message}'


def apply_conversion_error(name: str, message: str) -> str:
    """Server-side apply's message for an applied Event that does not convert (a 500)."""
    return (
        f"failed to convert new object (/{name}; /v1, Kind=Event) to proper version: "
        f"unable to convert unstructured object to /v1, Kind=Event: {message}"
    )
