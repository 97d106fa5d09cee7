"""Bounded bad input: what a huge or error-laden `providerConfig` costs the fail-closed Shoot admission (issue #32,
finding 5; targets: ≤ 10 ms of CPU and a denial under 2 KiB for a 1 MB providerConfig).

Any garden project member can send a Shoot; the Shoot admission judges its providerConfig on the webhook's event
loop. Through the core's own admission function (`core.admission.shoot.validate_shoot`), one call per repetition,
it prints per document: its compact JSON size, the CPU time of a call (`time.process_time`, median and max over
the repetitions), the denial's size in bytes and how many errors it names and counts; then the same for the seed
(`provider_config_errors`, aggregated, as the controller's `lastError`, through `core.gardener.extension.error`). For
calibration, the CPU time of `json.loads` of the document, which the webhook pays anyway when it parses the review.

Documents (each in a Shoot with one pool `w0`):
- `1 MB unknown fields`: the issue's shape, 60,000 entries `{"name": "w0", "bogus": i}`;
- `1 MB string`: one entry whose timeout is a 1 MB string;
- `1 MB wide object`: 60,000 unknown top-level keys;
- `1 MB list of numbers`: a timeout that is a list of 125,000 numbers (a deeply nested one never gets here: the
  webhook's JSON parser refuses about 1,000 levels);
- `64 KiB unknown fields`: the worst within the bounds that we know of, 200 entries with 40 unknown fields each
  (8,000 decoding errors);
- `valid`: one entry that passes (the cost of a normal request).

The script only uses functions that existed before the bounds, so a snapshot put first on PYTHONPATH measures that
code (`--repeat 1`: the unbounded code takes seconds per call).

    .venv/bin/python benchmarks/bounded_input.py              # 20 repetitions
    PYTHONPATH=/tmp/head/core .venv/bin/python benchmarks/bounded_input.py --repeat 1
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from machine_preservation.core.admission.field_errors import aggregate
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.shoot import provider_config_errors, validate_shoot
from machine_preservation.core.gardener import extension as contract
from machine_preservation.core.gardener.provider_config import API_VERSION, EXTENSION_TYPE, KIND

SETTINGS = AdmissionSettings()
MORE = re.compile(r"\.\.\. and (\d+) more errors?\]$")


def config(workers: list[Any], **extra: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "workers": workers, **extra}


def documents() -> dict[str, Any]:
    return {
        "1 MB unknown fields": config([{"name": "w0", "bogus": i} for i in range(60_000)]),
        "1 MB string": config([{"name": "w0", "machinePreserveTimeout": "7" * 1_000_000}]),
        "1 MB wide object": config([], **{f"unknownField{i:06d}": i for i in range(60_000)}),
        "1 MB list of numbers": config([{"name": "w0", "machinePreserveTimeout": [1234567] * 125_000}]),
        "64 KiB unknown fields": config([{"name": f"w{j}", **{f"k{i}": 0 for i in range(40)}} for j in range(200)]),
        "valid": config([{"name": "w0", "autoPreserveFailedMachineMax": 1, "machinePreserveTimeout": "72h"}]),
    }


def shoot(provider_config: Any) -> dict[str, Any]:
    workers = [{"name": "w0", "minimum": 1, "maximum": 4, "systemComponents": {"allow": False}}]
    return {
        "metadata": {"name": "s", "namespace": "garden-p"},
        "spec": {
            "provider": {"type": "aws", "workers": workers},
            "extensions": [{"type": EXTENSION_TYPE, "providerConfig": provider_config}],
        },
    }


def cpu(call: Callable[[], Any], repeat: int) -> tuple[list[float], Any]:
    times, result = [], None
    for _ in range(repeat):
        started = time.process_time()
        result = call()
        times.append(time.process_time() - started)
    return times, result


def counted(message: str) -> str:
    """How many errors the message names and how many it counts beyond them."""
    named = message.count(": Invalid value: ") + message.count(": Forbidden: ") + message.count(": Unsupported value: ")
    named += message.count(": Too long: ") + message.count(": Too many: ") + message.count(": Duplicate value: ")
    more = MORE.search(message)
    return f"{named} named" + (f" + {int(more.group(1))} counted" if more else "")


def ms(times: list[float]) -> str:
    return f"{statistics.median(times) * 1000:8.2f} / {max(times) * 1000:8.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20, help="calls per document (default 20)")
    args = parser.parse_args()
    now = dt.datetime.now(dt.UTC)
    print(f"{'document':<24}{'JSON':>10}  {'loads ms':>9}  {'admission ms p50 / max':>22}  denial")
    for name, document in documents().items():
        text = json.dumps(document, separators=(",", ":"), ensure_ascii=False)
        loads, _ = cpu(partial(json.loads, text), args.repeat)
        subject = shoot(document)
        admission, verdict = cpu(
            partial(validate_shoot, shoot=subject, old_shoot=None, settings=SETTINGS),
            args.repeat,
        )
        denial = "allowed" if verdict.allowed else f"{len(verdict.message.encode())} B, {counted(verdict.message)}"
        print(
            f"{name:<24}{len(text.encode()):>10}  {statistics.median(loads) * 1000:9.2f}  {ms(admission):>22}  {denial}"
        )
    print()
    print(f"{'seed (lastError)':<24}{'':>10}  {'':>9}  {'judge+patch ms p50 / max':>22}  lastError")
    for name, document in documents().items():
        subject = shoot(document)

        def seed(subject: dict[str, Any] = subject, document: Any = document) -> dict[str, Any] | None:
            errors = provider_config_errors(shoot=subject, provider_config=document, settings=SETTINGS)
            if not errors:
                return None  # the Extension would be Succeeded
            description = contract.error_text("error reconciling the Extension", aggregate(errors))
            return contract.error(contract.OperationType.RECONCILE, now, generation=1, description=description)

        times, patch = cpu(seed, args.repeat)
        written = "none" if patch is None else f"{len(patch['status']['lastError']['description'].encode())} B"
        print(f"{name:<24}{'':>10}  {'':>9}  {ms(times):>22}  {written}")


if __name__ == "__main__":
    main()
