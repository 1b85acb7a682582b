"""Human sizes and rates."""

from __future__ import annotations

import pytest

from memplan import InputError, parse_rate, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8GB", 8 * 10**9),
        ("8GiB", 8 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("1000", 1000),
        (1000, 1000),
        ("12 kb", 12_000),
        ("2TiB", 2 * 2**40),
        ("0", 0),
    ],
)
def test_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["8G", "8g", "3M", "1K"])
def test_bare_prefix_is_ambiguous(text):
    with pytest.raises(InputError, match=r"ambiguous.*B \(10\^n\) or .*iB \(2\^n\)"):
        parse_size(text)


@pytest.mark.parametrize("text", ["", "GB", "-1GB", "eight", "8 XB", "1e999", "1e30", True])
def test_bad_sizes_show_an_example(text):
    with pytest.raises(InputError, match="e.g."):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("12.2GB/s", 12.2e9), ("16GiB/s", 16 * 2**30), ("1e9", 1e9), (5e8, 5e8)],
)
def test_rates(text, expected):
    assert parse_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["0GB/s", "-3GB/s", "12G/s", "fast"])
def test_bad_rates(text):
    with pytest.raises(InputError):
        parse_rate(text)
