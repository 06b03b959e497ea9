"""bench.autoscaler_compare runs both controllers end to end in both worlds: Ray 2.60's
unmodified autoscaler (v2, IPPR) and raysize each grow the worker in place for the
`{CPU: 2}` task, launch nothing, fail no task, and the report names both. Who is faster
is the benchmark's to measure (README), not a test's to assert."""

from __future__ import annotations

from bench.autoscaler_compare import parse_args, row, run_all, summary


async def test_both_controllers_run_the_one_task_workload_in_both_worlds() -> None:
    args = parse_args(["--worlds", "embedded,real", "--rounds", "1", "--workloads", "one"])
    results = await run_all(args)
    assert [(r.world, r.controller) for r in results] == [
        ("embedded", "ray"),
        ("embedded", "raysize"),
        ("real", "ray"),
        ("real", "raysize"),
    ]
    for r in results:
        assert not r.error, row(r)
        assert r.failed == 0 and r.first_start_s is not None and r.done_s is not None, row(r)
        # in place: the 1-CPU worker grows (Ray to its 4-CPU maximum, raysize to 2)
        assert r.resizes >= 1 and r.launched == 0, row(r)
        assert r.cpu_added == (3.0 if r.controller == "ray" else 1.0), row(r)
    lines, _ = summary(results)
    assert [line.split(":")[0] for line in lines] == ["embedded/one", "real/one"]
    assert all("ray: first start" in line and "raysize: first start" in line for line in lines)
