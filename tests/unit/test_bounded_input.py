"""Bounded bad input (issue #32, finding 5): whatever a garden project member puts in a Shoot, the fail-closed Shoot
admission answers in bounded time with a denial under 2 KiB that still names the field paths and the allowed
values; the Extension's `lastError` stays within 2 KiB.

The bounds: a providerConfig of more than 64 KiB (compact JSON) or 256 `workers` is denied for that alone; an
aggregate names at most 10 errors and counts the rest; a quoted value shows about 80 characters."""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine_preservation.core.admission.field_errors import (
    MAX_ERRORS,
    MAX_MESSAGE_BYTES,
    aggregate,
    compact_json_exceeds,
    invalid,
    json_prefix,
    not_supported,
    render_value,
    root,
    shorten,
)
from machine_preservation.core.admission.settings import AdmissionSettings
from machine_preservation.core.admission.shoot import provider_config_errors, validate_shoot
from machine_preservation.core.gardener import extension as contract
from machine_preservation.core.gardener.provider_config import (
    API_VERSION,
    EXTENSION_TYPE,
    KIND,
    MAX_DOCUMENT_BYTES,
    MAX_WORKERS,
    InvalidPreservationConfig,
    parse_preservation_config,
)

SETTINGS = AdmissionSettings()
CONFIG = "spec.extensions[0].providerConfig"
MORE = re.compile(r", \.\.\. and (\d+) more errors?\]$")


def config(workers: list[Any], **extra: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "workers": workers, **extra}


def shoot(provider_config: Any, *, pools: int = 1) -> dict[str, Any]:
    workers = [{"name": f"w{i}", "minimum": 1, "maximum": 4} for i in range(pools)]
    return {
        "metadata": {"name": "s"},
        "spec": {
            "provider": {"type": "aws", "workers": workers},
            "extensions": [{"type": EXTENSION_TYPE, "providerConfig": provider_config}],
        },
    }


def denial(provider_config: Any, *, pools: int = 1) -> str:
    verdict = validate_shoot(shoot=shoot(provider_config, pools=pools), old_shoot=None, settings=SETTINGS)
    assert not verdict.allowed
    return verdict.message


def size(text: str) -> int:
    return len(text.encode())


def compact(value: Any) -> int:
    return size(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


# --- A huge providerConfig ----------------------------------------------------------------------------------


def test_a_megabyte_of_unknown_fields_is_denied_in_under_2_kib_naming_the_bounds() -> None:
    """The issue's measurement: ~1.2 MB made 300k errors and a 21 MB denial."""
    huge = config([{"name": "w0", "bogus": i} for i in range(60_000)])
    assert compact(huge) > 1_000_000
    message = denial(huge)
    assert size(message) < MAX_MESSAGE_BYTES
    assert message == (
        f"[{CONFIG}.workers: Too many: 60000: must have at most {MAX_WORKERS} items, "
        f"{CONFIG}: Too long: may not be more than {MAX_DOCUMENT_BYTES} bytes]"
    )


def test_one_huge_string_is_too_long_and_its_value_is_never_quoted() -> None:
    message = denial(config([{"name": "w0", "machinePreserveTimeout": "7" * 1_000_000}]))
    assert message == f"{CONFIG}: Too long: may not be more than {MAX_DOCUMENT_BYTES} bytes"


def test_too_many_workers_within_the_size_bound_is_denied_for_that_alone() -> None:
    entries = [{"name": f"w{i}"} for i in range(MAX_WORKERS + 1)]
    assert compact(config(entries)) < MAX_DOCUMENT_BYTES
    message = denial(config(entries), pools=MAX_WORKERS + 1)
    assert message == f"{CONFIG}.workers: Too many: {MAX_WORKERS + 1}: must have at most {MAX_WORKERS} items"


def test_the_most_workers_with_the_longest_values_pass() -> None:
    """256 pools with Gardener's longest names (15 characters) and long values: over 25 KiB, within the bounds."""
    pools = [f"pool-{i:010d}" for i in range(MAX_WORKERS)]
    timeout = "71h59m59.999999999s"
    entries = [{"name": n, "autoPreserveFailedMachineMax": 0, "machinePreserveTimeout": timeout} for n in pools]
    document = config(entries)
    assert compact(document) > 25 * 1024
    workers = [{"name": n, "minimum": 1, "maximum": 4} for n in pools]
    facts = {"metadata": {"name": "s"}, "spec": {"provider": {"workers": workers}}}
    assert provider_config_errors(shoot=facts, provider_config=document, settings=SETTINGS) == []


def test_the_seed_reports_a_huge_provider_config_as_briefly() -> None:
    """The controller judges the Extension's copy with the same function (its `lastError`)."""
    huge = config([{"name": "w0", "x": "y" * 100}] * 20_000)
    errors = provider_config_errors(shoot=shoot(huge), provider_config=huge, settings=SETTINGS)
    assert size(aggregate(errors)) < 300


# --- Error count -------------------------------------------------------------------------------------------


@given(st.integers(min_value=2, max_value=60))
def test_a_denial_names_at_most_10_errors_and_counts_the_rest(count: int) -> None:
    entries = [{"name": f"w{i}", "machinePreserveTimeout": f"{i}x"} for i in range(count)]
    message = denial(config(entries), pools=count)
    named = message.count(": Invalid value: ")
    total = count
    assert named == min(total, MAX_ERRORS)
    more = MORE.search(message)
    if total > MAX_ERRORS:
        assert more is not None
        assert int(more.group(1)) == total - MAX_ERRORS
    else:
        assert more is None
    assert size(message) < MAX_MESSAGE_BYTES


def test_thousands_of_decoding_errors_are_counted_exactly_without_being_built() -> None:
    entry = {"name": "w0", **{f"field{i}": 0 for i in range(1000)}}
    with pytest.raises(InvalidPreservationConfig) as caught:
        parse_preservation_config(config([entry]), path=root("x"))
    assert len(caught.value.errors) <= 3 * MAX_ERRORS
    message = str(caught.value)
    assert message.startswith("[x.workers[0].field0: Forbidden: unknown field (known fields: name, ")
    assert message.endswith(f", ... and {1000 - MAX_ERRORS} more errors]")


def test_the_first_of_many_errors_names_the_allowed_values() -> None:
    message = denial({"apiVersion": "v1", "kind": KIND, "workers": [{"name": "w0", f"x{i}": 0} for i in range(5)]})
    assert message.startswith(f'[{CONFIG}.apiVersion: Unsupported value: "v1": supported values: "{API_VERSION}", ')
    assert "known fields: name, autoPreserveFailedMachineMax, machinePreserveTimeout" in message


def test_a_single_error_too_long_alone_is_cut_and_keeps_its_path() -> None:
    path = root("spec", "provider", "workers").index(0).child("name")
    pools = ", ".join(f"pool{i}" for i in range(2000))
    one = aggregate([invalid(path, "x", f"must name a pool (pools: {pools})")])
    assert size(one) <= MAX_MESSAGE_BYTES
    assert one.startswith('spec.provider.workers[0].name: Invalid value: "x": must name a pool (pools: pool0, ')
    assert one.endswith("...[truncated]")
    several = aggregate([invalid(path, i, f"must name a pool (pools: {pools})") for i in range(3)])
    assert size(several) <= MAX_MESSAGE_BYTES
    assert several.startswith("[spec.provider.workers[0].name: Invalid value: 0: must name a pool")
    assert several.endswith(", ... and 2 more errors]")


def test_an_entry_naming_no_pool_of_a_shoot_with_hundreds_lists_the_first_20_and_the_count() -> None:
    message = denial(config([{"name": "nope"}]), pools=300)
    pools = ", ".join(f"w{i}" for i in range(20))
    assert message == (
        f'{CONFIG}.workers[0].name: Invalid value: "nope": must name a worker pool of spec.provider.workers '
        f"(pools: {pools}, ... (300 pools))"
    )


@given(st.lists(st.text(max_size=400), max_size=40))
def test_any_aggregate_fits_2_kib_and_accounts_for_every_error(details: list[str]) -> None:
    path = root("spec", "extensions").index(0).child("providerConfig")
    errors = [invalid(path.child("workers").index(i), text, text) for i, text in enumerate(details)]
    if not errors:
        return
    message = aggregate(errors)
    assert size(message) <= MAX_MESSAGE_BYTES
    assert message.startswith(str(errors[0].path) if len(errors) == 1 else f"[{errors[0].path}")
    more = MORE.search(message)
    named = message.count(": Invalid value: ")
    assert named + (int(more.group(1)) if more else 0) == len(errors)


# --- Quoted values -----------------------------------------------------------------------------------------


def test_a_long_quoted_value_is_cut_and_the_supported_values_still_named() -> None:
    message = denial({"apiVersion": API_VERSION, "kind": "K" * 50_000, "workers": []})
    assert message == f'{CONFIG}.kind: Unsupported value: "{"K" * 75}"...: supported values: "{KIND}"'


@given(st.text(min_size=81, max_size=5000))
def test_any_long_string_is_quoted_as_a_prefix_with_a_marker(text: str) -> None:
    shown = render_value(text)
    assert shown.endswith('"...')
    assert text.startswith(json.loads(shown[:-3]))
    assert len(json.loads(shown[:-3])) == 75


@given(st.text(max_size=80))
def test_short_strings_are_quoted_whole(text: str) -> None:
    assert json.loads(render_value(text)) == text


def rendered_whole(value: Any) -> str:
    """A structure encoded whole, then cut, as render_value did before it clipped what it encodes."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


structures = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40),
    lambda children: st.lists(children, max_size=50) | st.dictionaries(st.text(max_size=6), children, max_size=30),
    max_leaves=200,
).filter(lambda value: isinstance(value, (list, dict)))


@given(structures)
def test_a_structure_renders_as_if_encoded_whole_and_cut(value: Any) -> None:
    assert render_value(value) == rendered_whole(value)


@given(structures, st.integers(min_value=0, max_value=300))
def test_the_bounded_writer_writes_what_the_encoder_does_up_to_its_limit(value: Any, limit: int) -> None:
    whole = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)
    written = json_prefix(value, limit)
    assert written[: limit + 1] == whole[: limit + 1]
    assert (len(written) > limit) == (len(whole) > limit)


def test_a_huge_structure_is_rendered_without_being_encoded_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    encoded: list[int] = []
    dumps = json.dumps

    def recording(value: Any, **options: Any) -> str:
        text = dumps(value, **options)
        encoded.append(len(text))
        return text

    monkeypatch.setattr(json, "dumps", recording)
    wide: Any = list(range(1_000_000))
    many_keys = {str(i): i for i in range(100_000)}
    for _ in range(200):
        wide = [wide, many_keys]
    assert render_value(wide) == "[" * 77 + "..."
    assert render_value(many_keys) == rendered_whole({key: many_keys[key] for key in sorted(many_keys)[:30]})
    assert max(encoded) < 1000


def test_not_supported_quotes_its_value_cut() -> None:
    error = not_supported(root("kind"), "z" * 1000, ["PreservationConfig"])
    assert len(error.render()) < 160


# --- shorten and lastError ----------------------------------------------------------------------------------


@given(st.text(max_size=3000), st.integers(min_value=16, max_value=2048))
def test_shorten_keeps_short_text_and_cuts_long_text_within_its_bytes(text: str, limit: int) -> None:
    cut = shorten(text, limit)
    if size(text) <= limit:
        assert cut == text
    else:
        assert size(cut) <= limit
        assert cut.endswith("...[truncated]")
        assert text.startswith(cut.removesuffix("...[truncated]"))


NOW = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize("cause", ["é" * 500_000, "x" * 21_000_000])
def test_the_extensions_last_error_is_at_most_2_kib(cause: str) -> None:
    description = contract.error_text("error reconciling the Extension", cause)
    patch = contract.error(contract.OperationType.RECONCILE, NOW, generation=1, description=description)
    for written in (patch["status"]["lastError"]["description"], patch["status"]["lastOperation"]["description"]):
        assert size(written) <= MAX_MESSAGE_BYTES
        assert written.startswith("Error reconciling the Extension: ")
        assert written.endswith("...[truncated]")
    assert size(json.dumps(patch, ensure_ascii=False)) < 3 * MAX_MESSAGE_BYTES


def test_a_short_last_error_is_written_whole() -> None:
    patch = contract.error(contract.OperationType.RECONCILE, NOW, generation=1, description="Error: x")
    assert patch["status"]["lastError"]["description"] == "Error: x"


# --- The size bound -----------------------------------------------------------------------------------------

json_leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30)
json_values = st.recursive(
    json_leaves,
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=6),
    max_leaves=40,
)
ascii_leaves = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\'), max_size=30)
number_free = st.recursive(
    ascii_leaves,
    lambda children: st.lists(children, max_size=6) | st.dictionaries(ascii_leaves, children, max_size=6),
    max_leaves=40,
)


@given(json_values, st.integers(min_value=0, max_value=2000))
def test_the_size_bound_never_rejects_what_fits(value: Any, limit: int) -> None:
    if compact_json_exceeds(value, limit):
        assert compact(value) > limit


@given(number_free, st.integers(min_value=0, max_value=2000))
def test_the_size_bound_is_exact_for_text_without_escapes_or_numbers(value: Any, limit: int) -> None:
    assert compact_json_exceeds(value, limit) == (compact(value) > limit)


def test_the_size_bound_stops_early_on_wide_and_deep_input() -> None:
    assert compact_json_exceeds([0] * 10_000_000, MAX_DOCUMENT_BYTES)
    assert compact_json_exceeds({str(i): i for i in range(1_000_000)}, MAX_DOCUMENT_BYTES)
    deep: Any = 0
    for _ in range(200_000):
        deep = [deep]
    assert compact_json_exceeds(deep, MAX_DOCUMENT_BYTES)
