"""Kubernetes' times as the API server reads and writes them.

`metav1.Time` is read with Go's `time.Parse(time.RFC3339, s)`: any offset, an optional
fraction of any length (`.` or `,`), and written back in UTC to the second
(`2026-11-24T04:00:00Z`). `metav1.MicroTime` (an Event's `eventTime`) is read with
`RFC3339Micro` (exactly six fraction digits) and written in UTC to the microsecond.
Neither rounds: what does not fit is cut off. A value Go cannot parse fails with Go's own
message (`parsing time "x" as "2006-01-02T15:04:05Z07:00": cannot parse "x" as "2006"`),
which the API server passes on to the client.

`human_duration` is apimachinery's `duration.HumanDuration`: the AGE and LAST SEEN
columns of `kubectl get`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

RFC3339 = "2006-01-02T15:04:05Z07:00"
RFC3339_MICRO = "2006-01-02T15:04:05.000000Z07:00"

# The layouts as Go's parser walks them: (literal prefix, layout element) pairs.
_CHUNKS = {
    RFC3339: (("", "2006"), ("-", "01"), ("-", "02"), ("T", "15"), (":", "04"), (":", "05")),
    RFC3339_MICRO: (
        ("", "2006"),
        ("-", "01"),
        ("-", "02"),
        ("T", "15"),
        (":", "04"),
        (":", "05"),
        ("", ".000000"),
    ),
}


class TimeParseError(ValueError):
    """Go's `*time.ParseError`, with its message."""


@dataclass(frozen=True)
class Instant:
    """A point in time: whole seconds since the Unix epoch (UTC) plus nanoseconds."""

    seconds: int
    nanos: int = 0

    def rfc3339(self) -> str:
        """`metav1.Time`'s JSON: UTC, whole seconds."""
        return _format(self.seconds) + "Z"

    def rfc3339_micro(self) -> str:
        """`metav1.MicroTime`'s JSON: UTC, six fraction digits."""
        return f"{_format(self.seconds)}.{self.nanos // 1000:06d}Z"


def _quote(raw: bytes) -> str:
    """Go's `time.quote`: non-ASCII and control bytes as \\xNN, `"` and `\\` escaped."""
    out = ['"']
    for b in raw:
        if b >= 0x80 or b < 0x20:
            out.append(f"\\x{b:02x}")
        else:
            if b in (0x22, 0x5C):
                out.append("\\")
            out.append(chr(b))
    out.append('"')
    return "".join(out)


def _error(layout: str, value: bytes, layout_elem: str, value_elem: bytes) -> TimeParseError:
    return TimeParseError(
        f"parsing time {_quote(value)} as {_quote(layout.encode())}: "
        f"cannot parse {_quote(value_elem)} as {_quote(layout_elem.encode())}"
    )


def _range_error(value: bytes, message: str) -> TimeParseError:
    return TimeParseError(f"parsing time {_quote(value)}{message}")


def _digit(s: bytes, i: int) -> bool:
    return len(s) > i and 0x30 <= s[i] <= 0x39


def _getnum(s: bytes, fixed: bool) -> tuple[int, bytes] | None:
    if not _digit(s, 0):
        return None
    if not _digit(s, 1):
        return None if fixed else (s[0] - 0x30, s[1:])
    return (s[0] - 0x30) * 10 + s[1] - 0x30, s[2:]


def _atoi(s: bytes) -> int | None:
    """Go's `time.atoi`: an optional sign, then digits only."""
    neg = False
    if s[:1] in (b"-", b"+"):
        neg, s = s[:1] == b"-", s[1:]
    if not s or not all(0x30 <= b <= 0x39 for b in s):
        return None
    return -int(s) if neg else int(s)


def _nanoseconds(value: bytes, nbytes: int) -> tuple[int, str] | None:
    """Go's `parseNanoseconds`: the fraction in `value[:nbytes]` (separator included)."""
    if value[:1] not in (b".", b","):
        return None
    if nbytes > 10:
        value, nbytes = value[:10], 10
    ns = _atoi(value[1:nbytes])
    if ns is None:
        return None
    if ns < 0:
        return 0, "fractional second"
    return ns * 10 ** (10 - nbytes), ""


def _days_in(month: int, year: int) -> int:
    if month == 2:
        return 29 if year % 4 == 0 and (year % 100 != 0 or year % 400 == 0) else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _days_from_civil(y: int, m: int, d: int) -> int:
    """Days since 1970-01-01 of a proleptic Gregorian date (any year, 0 and before too)."""
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def _civil_from_days(z: int) -> tuple[int, int, int]:
    z += 719468
    era = (z if z >= 0 else z - 146096) // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + (3 if mp < 10 else -9)
    return yoe + era * 400 + (m <= 2), m, d


def _format(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    y, m, d = _civil_from_days(days)
    year = f"-{-y:04d}" if y < 0 else f"{y:04d}"
    return f"{year}-{m:02d}-{d:02d}T{rest // 3600:02d}:{rest // 60 % 60:02d}:{rest % 60:02d}"


def parse(text: str, layout: str = RFC3339) -> Instant:
    """Go's `time.Parse(layout, text)` for `RFC3339` and `RFC3339_MICRO`; raises
    `TimeParseError` with Go's message where Go fails."""
    original = value = text.encode()
    fields = {"2006": 0, "01": 0, "02": 0, "15": 0, "04": 0, "05": 0}
    nanos = 0
    chunks = _CHUNKS[layout]
    for i, (prefix, elem) in enumerate(chunks):
        if not value.startswith(prefix.encode()):
            raise _error(layout, original, prefix, value)
        value = value[len(prefix) :]
        hold, rng = value, ""
        got: tuple[int, bytes] | None
        if elem == "2006":
            got = None
            if len(value) >= 4 and _digit(value, 0):
                year = _atoi(value[:4])
                got = None if year is None else (year, value[4:])
        elif elem == ".000000":
            got = None
            if len(value) >= 7:
                parsed = _nanoseconds(value, 7)
                if parsed is not None:
                    nanos, rng = parsed
                    got = (0, value[7:])
        else:
            got = _getnum(value, fixed=elem != "15")
            if got is not None:
                n = got[0]
                if elem == "01" and not 1 <= n <= 12:
                    rng = "month"
                elif elem == "15" and n >= 24:
                    rng = "hour"
                elif elem == "04" and n >= 60:
                    rng = "minute"
                elif elem == "05" and n >= 60:
                    rng = "second"
        if got is not None:
            if elem in fields:
                fields[elem] = got[0]
            value = got[1]
        if (
            elem == "05"
            and got is not None
            and not rng
            and len(value) >= 2
            and value[:1] in (b".", b",")
            and _digit(value, 1)
            and not (i + 1 < len(chunks) and chunks[i + 1][1] == ".000000")
        ):
            # a fraction the layout does not have: Go takes it anyway
            n = 2
            while _digit(value, n):
                n += 1
            parsed = _nanoseconds(value, n)
            if parsed is None:
                got = None
            else:
                nanos, rng = parsed
                value = value[n:]
        if rng:
            raise _range_error(original, f": {rng} out of range")
        if got is None:
            raise _error(layout, original, elem, hold)
    # Z07:00
    hold = value
    offset = 0
    if value[:1] == b"Z":
        value = value[1:]
    else:
        ok = len(value) >= 6 and value[3:4] == b":"
        hours = _getnum(value[1:3], True) if ok else None
        minutes = _getnum(value[4:6], True) if hours is not None else None
        if hours is not None and hours[0] > 24:
            raise _range_error(original, ": time zone offset hour out of range")
        if minutes is not None and minutes[0] > 60:
            raise _range_error(original, ": time zone offset minute out of range")
        if minutes is None or hours is None or value[:1] not in (b"+", b"-"):
            raise _error(layout, original, "Z07:00", hold)
        offset = (hours[0] * 60 + minutes[0]) * 60 * (-1 if value[:1] == b"-" else 1)
        value = value[6:]
    if value:
        raise _range_error(original, f": extra text: {_quote(value)}")
    year, month, day = fields["2006"], fields["01"], fields["02"]
    if not 1 <= day <= _days_in(month, year):
        raise _range_error(original, ": day out of range")
    days = _days_from_civil(year, month, day)
    seconds = days * 86400 + fields["15"] * 3600 + fields["04"] * 60 + fields["05"] - offset
    return Instant(seconds, nanos)


def canonical_time(text: str) -> str:
    """A `metav1.Time` as the server writes it back (raises `TimeParseError`)."""
    return parse(text, RFC3339).rfc3339()


def canonical_micro_time(text: str) -> str:
    """A `metav1.MicroTime` as the server writes it back (raises `TimeParseError`)."""
    return parse(text, RFC3339_MICRO).rfc3339_micro()


def seconds_since(text: object, now: float | None = None) -> float | None:
    """How long ago a stored time was (None: no time, or not one Go would read)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        at = parse(text, RFC3339)
    except TimeParseError:
        return None
    return (time.time() if now is None else now) - (at.seconds + at.nanos / 1e9)


def human_duration(seconds: float) -> str:
    """apimachinery's `duration.HumanDuration`."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = hours // 24 % 365
        return f"{hours // 24 // 365}y{days}d" if days else f"{hours // 24 // 365}y"
    return f"{hours // 24 // 365}y"


def translate_since(text: object) -> str:
    """The printers' `translateTimestampSince`: `<unknown>` for no time."""
    ago = seconds_since(text)
    return "<unknown>" if ago is None else human_duration(ago)
