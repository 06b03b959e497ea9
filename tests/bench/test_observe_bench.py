"""`bench.observe_bench` runs and measures what it says, at a small size."""

from __future__ import annotations

from pathlib import Path

from bench.observe_bench import measure


def test_the_observe_bench_reads_the_same_cluster_from_the_cache_in_less_memory(
    tmp_path: Path,
) -> None:
    figures = measure(200, tmp_path)  # asserts inside: both reads see all 200 pods
    assert figures["json_bytes_per_pod"] > 5000  # pods shaped as KubeRay's, not toys
    # both keep records of the pods (`compact_pod`); the list's answer is parsed a page
    # at a time, and what it leaves is several times what the cache holds
    assert figures["cache_bytes_per_pod"] < figures["list_bytes_per_pod"] / 3
    assert figures["list_s"] > 0 and figures["cache_s"] > 0
