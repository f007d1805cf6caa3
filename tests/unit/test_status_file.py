"""A job's status file is read defensively: records parsed, garbage counted and ignored,
reads capped, enormous lines skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ebbtide.workers.status import (
    MAX_LINE_BYTES,
    MAX_READ_BYTES,
    Checkpoint,
    Progress,
    StatusReader,
    parse,
)


@pytest.mark.parametrize(
    ("line", "record"),
    [
        (
            {"type": "checkpoint", "path": "/c/1", "time": 12.5, "size_bytes": 10},
            Checkpoint("/c/1", 12.5, 10, None),
        ),
        ({"type": "checkpoint", "path": "/c/1"}, Checkpoint("/c/1", None)),
        ({"type": "progress", "done": 3, "total": 10}, Progress(3.0, 10.0)),
        ({"type": "progress", "done": 3, "total": "many"}, Progress(3.0, None)),
        ({"type": "checkpoint", "path": "/c", "size_bytes": -1}, Checkpoint("/c", None)),
    ],
)
def test_records(line: dict, record: object) -> None:  # type: ignore[type-arg]
    assert parse(json.dumps(line).encode()) == record


@pytest.mark.parametrize(
    "line",
    [
        b"not json",
        b"[1, 2]",
        b'"checkpoint"',
        b"{}",
        b'{"type": "checkpoint"}',
        b'{"type": "checkpoint", "path": 7}',
        b'{"type": "checkpoint", "path": ""}',
        b'{"type": "checkpoint", "path": "/c", "time": "noon"}',
        b'{"type": "checkpoint", "path": "/c", "time": 1e999}',
        b'{"type": "checkpoint", "path": "/c", "time": -5}',
        b'{"type": "checkpoint", "path": "/c", "time": true}',
        b'{"type": "progress"}',
        b'{"type": "progress", "done": NaN}',
        b'{"type": "explode"}',
        b"[" * 100_000,
    ],
)
def test_garbage_is_not_a_record(line: bytes) -> None:
    assert parse(line) is None


def test_reader_counts_garbage_and_skips_enormous_lines(tmp_path: Path) -> None:
    path = tmp_path / "status.jsonl"
    reader = StatusReader(path)
    assert reader.read() == []  # no file yet
    good = json.dumps({"type": "progress", "done": 1}).encode()
    path.write_bytes(b"garbage\n" + b"x" * (MAX_LINE_BYTES + 1) + b"\n" + good + b"\n" + b'{"ty')
    assert reader.read() == [Progress(1.0)]
    assert reader.garbage == 2
    assert reader.read() == []  # the unfinished line waits for its end


def test_reader_reads_at_most_a_capped_chunk_per_call(tmp_path: Path) -> None:
    path = tmp_path / "status.jsonl"
    line = json.dumps({"type": "progress", "done": 1}).encode() + b"\n"
    path.write_bytes(line * (3 * MAX_READ_BYTES // len(line)))
    reader = StatusReader(path)
    first = reader.read()
    assert 0 < len(first) <= MAX_READ_BYTES // len(line)
    total = len(first)
    while batch := reader.read():
        total += len(batch)
    assert total == 3 * MAX_READ_BYTES // len(line)


def test_a_line_with_no_end_bigger_than_a_read_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "status.jsonl"
    good = json.dumps({"type": "progress", "done": 2}).encode()
    path.write_bytes(b"y" * (2 * MAX_READ_BYTES + 5) + b"\n" + good + b"\n")
    reader = StatusReader(path)
    records = []
    for _ in range(5):
        records += reader.read()
    assert records == [Progress(2.0)]
    assert reader.garbage == 1
