"""Where a preservation's time goes, from the request lines of `sitecustomize.py` (the extension's file).

For every sample node `sNNN-NNN` (seed_scale.py's names): from the first Machine patch (the record) to the first
eviction sent, the evictions (first sent to last answered), the last eviction to the node's condition answered,
and the new connections the evictions opened. Prints medians and p90; with a node name, that node's requests.

    .venv/bin/python benchmarks/request_trace/timeline.py /tmp/trace/req.<extension pid> [s007-000]
"""

from __future__ import annotations

import collections
import re
import statistics
import sys

Request = tuple[float, float, str, str, str]  # start, duration, method, path, connection


def read(path: str) -> dict[str, list[Request]]:
    by_node: dict[str, list[Request]] = collections.defaultdict(list)
    with open(path) as lines:
        for line in lines:
            parts = line.split()
            if len(parts) < 6 or (match := re.search(r"(s\d{3}-\d{3})", parts[4])) is None:
                continue
            by_node[match.group(1)].append((float(parts[0]), float(parts[1]), parts[2], parts[4], parts[5][5:]))
    return by_node


def phases(by_node: dict[str, list[Request]]) -> dict[str, list[float]]:
    found: dict[str, list[float]] = collections.defaultdict(list)
    for requests in by_node.values():
        requests.sort()
        record = next((r for r in requests if r[2] == "PATCH" and "/machines/" in r[3]), None)
        if record is None:
            continue
        start = record[0]
        evictions = [r for r in requests if r[3].endswith("/eviction") and r[0] < start + 5]
        if not evictions:
            continue
        conditions = [r for r in requests if "/nodes/" in r[3] and r[3].endswith("/status") and r[0] < start + 5]
        first_sent = min(r[0] for r in evictions)
        last_answered = max(r[0] + r[1] for r in evictions)
        found["record -> first eviction sent (ms)"].append((first_sent - start) * 1000)
        found["evictions, first sent -> last answered (ms)"].append((last_answered - first_sent) * 1000)
        if conditions:
            found["last eviction -> condition answered (ms)"].append(
                (max(r[0] + r[1] for r in conditions) - last_answered) * 1000
            )
        found["new connections for the evictions"].append(sum(r[4].endswith("ms") for r in evictions))
    return found


def main() -> None:
    by_node = read(sys.argv[1])
    for name, values in phases(by_node).items():
        values.sort()
        p90 = values[int(len(values) * 0.9)]
        print(f"{name:46s} n={len(values):3d} p50={statistics.median(values):7.1f} p90={p90:7.1f}")
    if len(sys.argv) > 2:
        requests = sorted(by_node[sys.argv[2]])
        for started, duration, method, path, connection in requests[:40]:
            offset = (started - requests[0][0]) * 1000
            print(f"{offset:8.1f} +{duration * 1000:6.1f} {method:6s} {path[-70:]} {connection}")


if __name__ == "__main__":
    main()
