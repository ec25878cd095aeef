"""The file mode on hostile bytes: bounded reading, one record per line, nothing overwritten."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from context_assembler import filemode
from context_assembler.engine.policy import Policy
from context_assembler.filemode import BOM, OutputConflict, output_file, read_lines, refuse_overlaps
from context_assembler.intake.codec import RAW_KEPT_BYTES, Excerpt, Limits
from context_assembler.intake.policy_registry import PolicyRegistry
from tests.factories import EXAMPLES

GOOD = (EXAMPLES / "events.jsonl").read_bytes().splitlines()


class Recorded(io.BytesIO):
    """A stream that remembers the largest read asked of it."""

    largest = 0

    def readline(self, size: int | None = -1, /) -> bytes:
        assert size is not None and size > 0, "an unbounded readline"
        self.largest = max(self.largest, size)
        return super().readline(size)


def test_lines_lose_their_terminator_and_only_the_first_loses_a_bom() -> None:
    stream = io.BytesIO(BOM + b"one\r\n\n  \ntwo\n" + BOM + b"three\r")
    assert list(read_lines(stream, 100)) == [(1, b"one"), (4, b"two"), (5, BOM + b"three\r")]


def test_an_over_long_line_is_never_held_whole() -> None:
    line = b'{"request_id": "r", "question": "' + b"x" * 1_000_000 + b'"}'
    stream = Recorded(line + b"\r\n" + GOOD[0] + b"\n")
    (number, excerpt), (after, good) = read_lines(stream, 100_000)
    assert stream.largest <= 100_000 + 5  # the line is skipped in chunks of 64 KiB
    assert isinstance(excerpt, Excerpt) and (number, after, good) == (1, 2, GOOD[0])
    assert excerpt == Excerpt.of(line)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40).filter(lambda b: b"\n" not in b),
       st.sampled_from([b"\n", b"\r\n", b"\r\r\n", b""]), st.integers(1, 12), st.integers(1, 5))
def test_an_over_long_line_has_the_length_and_digest_of_the_whole_line(
    content: bytes, terminator: bytes, max_bytes: int, chunk: int
) -> None:
    data = b"\n" + content + terminator + (b"{}\n" if terminator else b"")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(filemode, "_SKIP_CHUNK", chunk)  # every boundary, "\r" at one included
        found = dict(read_lines(io.BytesIO(data), max_bytes))
    whole = content + terminator  # a line ends at "\r\n" or "\n", whatever content held
    line = whole[:-2] if whole.endswith(b"\r\n") else whole.removesuffix(b"\n")
    assert found.get(3) == (b"{}" if terminator else None)
    if not line.strip():
        assert 2 not in found
    elif len(line) <= max_bytes:
        assert found[2] == line
    elif len(line) > max_bytes + 2:
        assert found[2] == Excerpt.of(line)
    else:
        assert found[2] in (line, Excerpt.of(line))


def registry() -> PolicyRegistry:
    return PolicyRegistry(Policy())


def run(data: bytes, limits: Limits) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    prompts, errors = io.BytesIO(), io.BytesIO()
    filemode.run([("in", io.BytesIO(data))], registry(), limits, prompts=prompts, audits=None,
                 errors=errors)
    return ([json.loads(line) for line in prompts.getvalue().splitlines()],
            [json.loads(line) for line in errors.getvalue().splitlines()])


def test_an_over_long_line_is_reported_with_its_length_and_digest() -> None:
    huge = b'{"request_id": "huge", "question": "' + "é".encode() * 600_000 + b'"}'
    prompts, errors = run(GOOD[0] + b"\n" + huge + b"\n" + GOOD[1] + b"\n",
                          Limits(max_event_bytes=100_000))
    assert len(prompts) == 2
    [record] = errors
    assert (record["origin"], record["reason"]) == ("in:2", "limits")
    assert record["message"] == f"event is {len(huge)} bytes, over max_event_bytes=100000"
    assert len(record["raw"].encode()) <= RAW_KEPT_BYTES and record["raw_truncated"]
    assert "\ufffd" not in record["raw"]  # cut between characters
    assert record["raw_bytes"] == len(huge)
    assert record["raw_sha256"] == "sha256:" + hashlib.sha256(huge).hexdigest()


def test_a_bom_opening_a_file_is_accepted() -> None:
    prompts, errors = run(BOM + GOOD[0] + b"\n", Limits())
    assert (len(prompts), errors) == (1, [])


LINES = st.one_of(
    st.binary(max_size=60),
    st.sampled_from(GOOD[2:5]).flatmap(lambda g: st.integers(0, len(g)).map(lambda n: g[:n])),
    st.sampled_from(GOOD[2:5]).map(lambda g: BOM + g),
    st.sampled_from(GOOD[2:5]).map(lambda g: g.replace(b'"text"', b'"text": "\xff", "t"', 1)),
    st.integers(1, 5000).map(lambda n: b'{"request_id": "' + b"r" * n + b'"}'),
    st.just(b"   "),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(LINES, max_size=8), st.sampled_from([b"\n", b"\r\n"]))
def test_every_non_blank_line_gives_exactly_one_record(lines: list[bytes], newline: bytes) -> None:
    lines = [line.replace(b"\n", b" ") for line in lines]
    data = newline.join(lines)
    prompts, errors = run(data, Limits(max_event_bytes=1500))
    stripped = [line.removeprefix(BOM) if n == 0 else line for n, line in enumerate(lines)]
    expected = [n for n, line in enumerate(stripped, start=1) if line.strip()]
    assert len(prompts) + len(errors) == len(expected)
    assert {int(e["origin"].removeprefix("in:")) for e in errors} <= set(expected)
    for record in errors:
        assert len(record["raw"]) <= RAW_KEPT_BYTES
        line = stripped[int(record["origin"].removeprefix("in:")) - 1]
        if newline == b"\r\n" or not line.endswith(b"\r"):
            assert record["raw_bytes"] == len(line)


def test_an_output_that_is_an_input_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(GOOD[0])
    (tmp_path / "link.jsonl").symlink_to(source)
    os.link(source, tmp_path / "hard.jsonl")
    for name in ("in.jsonl", "link.jsonl", "hard.jsonl", "../" + tmp_path.name + "/in.jsonl"):
        with pytest.raises(OutputConflict, match="is the same file as the input"):
            refuse_overlaps([str(source)], {"--out": str(tmp_path / name)})
    new = str(tmp_path / "new.jsonl")
    with pytest.raises(OutputConflict, match=r"--audit .* is the same file as --out"):
        refuse_overlaps([str(source)], {"--out": new, "--audit": str(tmp_path / "." / "new.jsonl")})
    refuse_overlaps([str(source)], {"--out": new, "--audit": os.devnull, "--errors": os.devnull})


def test_an_output_is_replaced_whole_or_left_alone(tmp_path: Path) -> None:
    target = tmp_path / "out.jsonl"
    target.write_bytes(b"old\n")
    target.chmod(0o640)
    with pytest.raises(KeyboardInterrupt), output_file(str(target)) as stream:
        stream.write(b"half")
        raise KeyboardInterrupt
    assert target.read_bytes() == b"old\n" and os.listdir(tmp_path) == ["out.jsonl"]
    link = tmp_path / "link.jsonl"
    link.symlink_to(target)
    with output_file(str(link)) as stream:
        stream.write(b"new\n")
        assert target.read_bytes() == b"old\n"
    assert link.is_symlink() and target.read_bytes() == b"new\n"
    assert target.stat().st_mode & 0o777 == 0o640
    with output_file(os.devnull) as stream:  # a device is written, never replaced
        stream.write(b"gone")
