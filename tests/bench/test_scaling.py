"""The scaling benchmark's verdict: linear from the 100-chunk point, small events exempt."""

from __future__ import annotations

import pytest

from bench.scaling import BASE, rows


def test_a_size_is_judged_against_the_line_through_the_base_point() -> None:
    ms = 1_000_000  # samples are nanoseconds
    found = rows("warm", {10: [1 * ms], BASE: [4 * ms, 4 * ms], 1000: [44 * ms], 10_000: [600 * ms]})
    assert [row.linear_ratio for row in found] == [None, 1.0, pytest.approx(1.1),
                                                   pytest.approx(1.5)]
    assert found[0].per_chunk_us == pytest.approx(100.0)
    assert found[1].median_ms == 4.0
