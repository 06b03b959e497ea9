"""What `kubectl get` prints, and the API behind it, in both worlds (the embedded sandbox
and the real kube-apiserver: where they differ, the real server is the judge).

- Event times: the server reads RFC 3339 with any offset (Python's `isoformat()`) and
  writes them back in UTC with `Z`; `kubectl get events` prints such an Event. A time it
  cannot parse is refused with Go's parse error.
- `kubectl get pods -w`: every change is printed with the same columns as the first
  list (the watch answers one Table per event, the columns in the first).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from raysize.sandbox import kubetime
from raysize.sandbox.apistore import KubeHttp
from raysize.sandbox.errors import ApiError
from tests.orchestration.temporal_env import venv_binary
from tests.sandbox.conftest import PARKED_NODE, pod_body, wait_for

KUBECTL = venv_binary("kubectl")
TABLE = (
    "application/json;as=Table;v=v1;g=meta.k8s.io,"
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
)
TIME_LAYOUT = "2006-01-02T15:04:05Z07:00"
MICRO_LAYOUT = "2006-01-02T15:04:05.000000Z07:00"


def kubectl(kubeconfig: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KUBECTL, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": kubeconfig, "HOME": str(home)},
    )


class Lines:
    """A process's stdout, line by line, as it comes (read by a thread of its own)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()
        assert proc.stdout is not None
        self._thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            with self._lock:
                self.lines.append(line.rstrip("\n"))

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self.lines)


@contextlib.contextmanager
def background(kubeconfig: str, home: Path, *args: str) -> Iterator[Lines]:
    """`kubectl ARGS` in its own process group, stopped by that group however the test
    ends (SIGTERM, then SIGKILL if it is still there after 10s)."""
    proc = subprocess.Popen(
        [KUBECTL, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "KUBECONFIG": kubeconfig, "HOME": str(home)},
    )
    try:
        yield Lines(proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def event_body(name: str, ns: str, **fields: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns},
        "involvedObject": {"kind": "Pod", "namespace": ns, "name": "p"},
        "reason": "ResizeStarted",
        "message": "resizing",
        "type": "Normal",
        "source": {"component": "raysize"},
        **fields,
    }


@pytest.fixture
def http(kubeconfig: str) -> KubeHttp:
    """Plain JSON calls: the bytes sent are the test's (the `kubernetes` client would
    parse and re-serialize times, and refuse some before sending)."""
    return KubeHttp.from_kubeconfig(kubeconfig)


def events_path(ns: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{ns}/events" + (f"/{name}" if name else "")


def minutes(age: str) -> int:
    """Whole minutes of a kubectl age under an hour (`3m`, `3m12s`, `45s`)."""
    match = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", age)
    assert match and age, f"not an age under an hour: {age!r}"
    return int(match.group(1) or 0)


# --- events ---------------------------------------------------------------------------
def test_an_event_written_with_python_isoformat_times_is_stored_in_utc_and_listed(
    http, kubeconfig, ns, tmp_path
):
    """`datetime.isoformat()` times (`+02:00` offsets, microseconds) are read and stored
    canonically: Time in UTC to the second, MicroTime to the microsecond. `kubectl get
    events` lists the Event (it got EOF from the sandbox before), its LAST SEEN from the
    series' last observation, FIRST SEEN from firstTimestamp."""
    plus2 = timezone(timedelta(hours=2))
    # a second back before fixing the microseconds: "now" never lies ahead of the clock,
    # so what happened 3 minutes before it is always at least 3m0s old to kubectl
    now = (datetime.now(UTC) - timedelta(seconds=1)).replace(microsecond=123456)
    first, last_seen = now - timedelta(minutes=10), now - timedelta(minutes=3)
    http.call(
        "POST",
        events_path(ns),
        event_body(
            "p.python",
            ns,
            firstTimestamp=first.astimezone(plus2).isoformat(),  # ...+02:00
            lastTimestamp=first.isoformat(),  # ...+00:00
            eventTime=first.isoformat(),
            series={"count": 4, "lastObservedTime": last_seen.astimezone(plus2).isoformat()},
            count=1,
            reportingComponent="raysize",
            reportingInstance="raysize-worker",
            action="Resize",
        ),
    )
    stored = http.call("GET", events_path(ns, "p.python"))
    assert stored["firstTimestamp"] == first.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert stored["lastTimestamp"] == first.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert stored["eventTime"] == first.strftime("%Y-%m-%dT%H:%M:%S.123456Z")
    assert stored["series"] == {
        "count": 4,
        "lastObservedTime": last_seen.strftime("%Y-%m-%dT%H:%M:%S.123456Z"),
    }
    assert stored["metadata"]["creationTimestamp"].endswith("Z")

    out = kubectl(kubeconfig, tmp_path, "get", "events", "-n", ns)
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert len(rows) == 1, out.stdout
    last, type_, reason, obj, message = rows[0].split()
    assert (type_, reason, obj, message) == ("Normal", "ResizeStarted", "pod/p", "resizing")
    assert 3 <= minutes(last) < 10, out.stdout

    wide = kubectl(kubeconfig, tmp_path, "get", "events", "-n", ns, "-o", "wide")
    assert wide.returncode == 0, wide.stderr
    header, row = wide.stdout.splitlines()
    assert header.split()[-4:] == ["FIRST", "SEEN", "COUNT", "NAME"]
    first_seen, count, name = row.split()[-3:]
    assert (count, name) == ("4", "p.python")
    assert 10 <= minutes(first_seen) < 20, wide.stdout


def test_an_event_time_that_does_not_parse_is_refused_with_the_parse_error(http, ns):
    """Create and replace: 400 BadRequest, the body cannot be decoded (Go's time.Parse
    error). A patch whose result has such a time: 422 on field "patch". Nothing is kept."""
    handled = 'Event in version "v1" cannot be handled as a Event: '
    for field, value, layout, rest in (
        ("firstTimestamp", "yesterday", TIME_LAYOUT, '"yesterday" as "2006"'),
        ("lastTimestamp", "2026-11-24T04:00:00", TIME_LAYOUT, '"" as "Z07:00"'),
        ("eventTime", "2026-11-24T04:00:00Z", MICRO_LAYOUT, '"Z" as ".000000"'),
    ):
        with pytest.raises(ApiError) as err:
            http.call("POST", events_path(ns), event_body("p.bad", ns, **{field: value}))
        assert (err.value.code, err.value.reason) == (400, "BadRequest")
        assert err.value.message == (
            f'{handled}parsing time "{value}" as "{layout}": cannot parse {rest}'
        )
    with pytest.raises(ApiError) as err:
        http.call("POST", events_path(ns), event_body("p.bad", ns, lastTimestamp=12))
    assert err.value.message == (
        f"{handled}json: cannot unmarshal number into Go struct field Event.lastTimestamp "
        "of type string"
    )

    http.call("POST", events_path(ns), event_body("p.good", ns))
    with pytest.raises(ApiError) as err:
        bad = event_body("p.good", ns, lastTimestamp="2026-13-01T00:00:00Z")
        http.call("PUT", events_path(ns, "p.good"), bad)
    assert (err.value.code, err.value.reason) == (400, "BadRequest")
    assert err.value.message == f'{handled}parsing time "2026-13-01T00:00:00Z": month out of range'

    for patch_type in ("merge-patch", "strategic-merge-patch"):
        with pytest.raises(ApiError) as err:
            http.call(
                "PATCH",
                events_path(ns, "p.good"),
                {"lastTimestamp": "nope"},
                content_type=f"application/{patch_type}+json",
            )
        assert (err.value.code, err.value.reason) == (422, "Invalid")
        assert err.value.details is not None
        assert [c["field"] for c in err.value.details["causes"]] == ["patch"]
        assert err.value.message.endswith(
            f'parsing time "nope" as "{TIME_LAYOUT}": cannot parse "nope" as "2006"'
        )
    names = [e["metadata"]["name"] for e in http.call("GET", events_path(ns))["items"]]
    assert names == ["p.good"]
    stored = http.call("GET", events_path(ns, "p.good"))  # unset times: null, as the server
    assert (stored["firstTimestamp"], stored["lastTimestamp"], stored["eventTime"]) == (
        None,
        None,
        None,
    )


# What kube-apiserver v1.36.3 answered for these, read as a Time and as a MicroTime: the
# value stored, or (after `Event in version "v1" cannot be handled as a Event: `) the
# error, where `P` stands for `parsing time "<the text>"` and T / M for the layouts.
P, T, M = "parsing time <text>", f' as "{TIME_LAYOUT}": ', f' as "{MICRO_LAYOUT}": '
REAL_SERVER_TIMES = [
    ("2026-11-24T04:00:00.123456+00:00", "2026-11-24T04:00:00Z", "2026-11-24T04:00:00.123456Z"),
    ("2026-11-24T05:00:00.654321+01:00", "2026-11-24T04:00:00Z", "2026-11-24T04:00:00.654321Z"),
    ("2026-11-24T04:00:00.999999+00:00", "2026-11-24T04:00:00Z", "2026-11-24T04:00:00.999999Z"),
    ("2026-02-03T4:00:00,5-07:30", "2026-02-03T11:30:00Z", P + M + 'cannot parse ",5-07:30" as ".000000"'),
    ("2026-11-24T06:00:00.5+02:00", "2026-11-24T04:00:00Z", P + M + 'cannot parse ".5+02:00" as ".000000"'),
    ("2026-11-24T04:00:00Z", "2026-11-24T04:00:00Z", P + M + 'cannot parse "Z" as ".000000"'),
    ("2026-11-24T04:00:00.123456789Z", "2026-11-24T04:00:00Z", P + M + 'cannot parse "789Z" as "Z07:00"'),
    ("2026-11-24T04:00:00", P + T + 'cannot parse "" as "Z07:00"', P + M + 'cannot parse "" as ".000000"'),
    ("2026-11-24", P + T + 'cannot parse "" as "T"', P + M + 'cannot parse "" as "T"'),
    ("yesterday", P + T + 'cannot parse "yesterday" as "2006"', P + M + 'cannot parse "yesterday" as "2006"'),
    ("2026-11-24t04:00:00z", P + T + 'cannot parse "t04:00:00z" as "T"', P + M + 'cannot parse "t04:00:00z" as "T"'),
    ("", P + T + 'cannot parse "" as "2006"', P + M + 'cannot parse "" as "2006"'),
    ("2026-13-01T00:00:00Z", P + ": month out of range", P + ": month out of range"),
    ("2026-02-30T00:00:00Z", P + ": day out of range", P + M + 'cannot parse "Z" as ".000000"'),
    ("2026-02-03T00:00:00Zjunk", P + ': extra text: "junk"', P + M + 'cannot parse "Zjunk" as ".000000"'),
]  # fmt: skip


@pytest.mark.parametrize(("text", "as_time", "as_micro"), REAL_SERVER_TIMES)
def test_times_are_read_and_written_as_the_real_server_does(text, as_time, as_micro):
    for parse, want in (
        (kubetime.canonical_time, as_time),
        (kubetime.canonical_micro_time, as_micro),
    ):
        if not want.startswith(P):
            assert parse(text) == want
            continue
        with pytest.raises(kubetime.TimeParseError) as err:
            parse(text)
        assert str(err.value) == want.replace(P, f'parsing time "{text}"')


def test_a_time_with_bytes_go_does_not_print_is_quoted_as_go_quotes_it():
    with pytest.raises(kubetime.TimeParseError) as err:
        kubetime.canonical_time('2026-02-03T00:00:00Z\u00e9"')
    assert str(err.value) == (  # as the real server said it
        'parsing time "2026-02-03T00:00:00Z\\xc3\\xa9\\"": extra text: "\\xc3\\xa9\\""'
    )


# --- kubectl get -w -------------------------------------------------------------------
def parked(core: client.CoreV1Api, ns: str, name: str) -> None:
    """A pod on a node no kubelet runs: only the test changes it."""
    body = pod_body(name, requests={"cpu": "100m", "memory": "64Mi"})
    body["spec"]["nodeName"] = PARKED_NODE
    core.create_namespaced_pod(ns, body)


def test_kubectl_get_pods_watch_prints_every_column_for_every_change(
    core, kubeconfig, ns, tmp_path
):
    """Every line `kubectl get pods -w` prints after the list has the list's columns
    (the sandbox sent plain Pods in the watch, and kubectl fell back to NAME and AGE)."""
    parked(core, ns, "a")
    with background(kubeconfig, tmp_path, "get", "pods", "-w", "-n", ns) as out:
        wait_for(lambda: any(line.startswith("a ") for line in out.snapshot()), timeout=60)
        core.patch_namespaced_pod("a", ns, {"metadata": {"labels": {"changed": "yes"}}})
        parked(core, ns, "b")
        wait_for(
            lambda: (
                sum(line.startswith("a ") for line in out.snapshot()) >= 2
                and any(line.startswith("b ") for line in out.snapshot())
            ),
            timeout=60,
        )
    header, *lines = out.snapshot()
    assert header.split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"], out.lines
    assert len(lines) >= 3, out.lines
    for line in lines:
        name, ready, status, restarts, age = line.split()  # five columns, every line
        assert name in ("a", "b"), line
        assert (ready, status, restarts) == ("0/1", "Pending", "0"), line
        assert re.fullmatch(r"\d+[smhd]\w*", age), line


def test_a_watch_asked_for_tables_sends_one_table_per_event_with_the_columns_first(core, ns):
    """The protocol behind `kubectl get -w`: each event's object is a Table with the
    object's row (and its metadata), at the object's resourceVersion; the first carries
    the column definitions, the others none (kubectl keeps the first ones)."""
    start = core.list_namespaced_pod(ns).metadata.resource_version
    response = core.list_namespaced_pod(
        ns,
        watch=True,
        resource_version=start,
        timeout_seconds=60,
        _preload_content=False,
        _headers={"Accept": TABLE},
    )
    events: list[dict[str, Any]] = []
    try:
        parked(core, ns, "a")
        core.patch_namespaced_pod("a", ns, {"metadata": {"labels": {"changed": "yes"}}})
        for line in response:
            if line.strip():
                events.append(json.loads(line))
            if len(events) == 2:
                break
    finally:
        response.release_conn()
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED"]
    tables = [e["object"] for e in events]
    assert all((t["kind"], t["apiVersion"]) == ("Table", "meta.k8s.io/v1") for t in tables)
    columns = [c["name"] for c in tables[0]["columnDefinitions"]]
    assert columns[:5] == ["Name", "Ready", "Status", "Restarts", "Age"]
    assert not tables[1].get("columnDefinitions")
    for t in tables:
        (row,) = t["rows"]
        assert len(row["cells"]) == len(columns)
        assert row["cells"][:4] == ["a", "0/1", "Pending", row["cells"][3]]
        assert row["object"]["kind"] == "PartialObjectMetadata"
        assert row["object"]["metadata"]["name"] == "a"
        assert t["metadata"]["resourceVersion"] == row["object"]["metadata"]["resourceVersion"]
    assert tables[1]["rows"][0]["object"]["metadata"]["labels"] == {
        "app": "conformance",
        "changed": "yes",
    }
