"""Properties of policy files: YAML text that follows the schema with random values,
text that almost does (duplicate keys, anchors, flow and block styles), and garbage.
Each is a :class:`ConfigError` whose every line names the file, line and column (and
the field path), or a policy within bounds; never another exception."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ebbtide.config.policy import Defaults, QueueConfig, load_policy, parse_policy
from ebbtide.config.windows import CronWindow, LullWindow
from ebbtide.errors import ConfigError
from tests.unit.fuzz_support import NUMBER_TEXT, QUANTITY_TEXT, assert_policy_in_bounds, fuzz
from tests.unit.fuzz_support import mostly as _mostly


def mostly(good: st.SearchStrategy, bad: st.SearchStrategy) -> st.SearchStrategy:
    """A file holds many values: each goes wrong rarely, so that whole files pass too."""
    return _mostly(good, bad, one_in=12)


FILE = "p.yaml"
LINE = re.compile(rf"^{re.escape(FILE)}:\d+:\d+: (\S+: )?.+$|^{re.escape(FILE)}: and \d+ more")

#: Plain YAML scalars: what YAML 1.1 reads as booleans, nulls, floats, dates, sexagesimals.
YAML_WORDS = st.sampled_from(
    [
        "yes",
        "no",
        "on",
        "off",
        "true",
        "False",
        "~",
        "null",
        ".inf",
        "-.inf",
        ".nan",
        "1.0e+999",
        "0x1F",
        "0o17",
        "1_000",
        "1:30",
        "02:00:00",
        "2026-12-24",
        "2026-02-30",
        "0",
        "-1",
        "0.000001",
        "1us",
        "30s",
        "2h",
        "40GiB",
        "2TiB",
        "1e400",
        "'5'",
        '""',
        "[]",
        "{}",
        "!!binary aGk=",
        "!!str 5",
        "!!float 1",
        "9" * 80,
    ]
)
SCALAR = st.one_of(
    YAML_WORDS,
    NUMBER_TEXT.map(json.dumps),
    QUANTITY_TEXT.map(json.dumps),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats().map(lambda f: json.dumps(f) if f == f and abs(f) != float("inf") else ".nan"),
    st.text(max_size=12).map(json.dumps),
)
CRON_FIELD = st.sampled_from(
    [
        "*",
        "0",
        "5",
        "22",
        "31",
        "30",
        "29",
        "2",
        "feb",
        "*/0",
        "*/15",
        "1-5",
        "5-1",
        "60",
        "mon-fri",
        "sun",
        "7",
        "8",
        "last",
        "L",
        "?",
        "1,2",
        "x",
    ]
)
CRON = mostly(
    st.sampled_from(["0 22 * * mon-fri", "0 0 29 2 *", "*/15 * * * *", "0 6 1 * *"]),
    st.lists(CRON_FIELD, min_size=4, max_size=6).map(" ".join),
).map(json.dumps)


def _flow(pairs: list[tuple[str, str]]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in pairs) + "}"


def _good(name: str) -> st.SearchStrategy[str]:
    """Values that are usually right for the field ``name``."""
    if name in ("heartbeat_timeout_s", "dispatch_timeout_s"):
        return st.sampled_from(["2s", "10s", "1h", "30"])
    if name.endswith("deadline_s"):
        return st.sampled_from(["1s", "30s", "1h", "5"])
    if name == "forecast_history_s":
        return st.sampled_from(["1s", "1h", "7d"])
    if name.endswith("_s") or name == "for":
        return st.sampled_from(["0", "1s", "30s", "10m", "1d"])
    if name.endswith("_pct"):
        return st.sampled_from(["0", "5", "12.5", "100"])
    if name.endswith(("_mib", "memory")):
        return st.sampled_from(["0", "2GiB", "8192", "1TiB"])
    if name.endswith(("quantile", "share")):
        return st.sampled_from(["0.5", "0.9", "1"])
    if name == "priority":
        return st.sampled_from(["-1024", "0", "1023"])
    if name.startswith("max_"):
        return st.sampled_from(["1", "5", "1000000"])
    if name == "preemptible":
        return st.sampled_from(["true", "no", "false"])
    if name == "queues":
        return st.sampled_from(["[default]", '["default"]', "[gpu]"])
    if name == "pool":
        return st.just("p")
    if name == "timezone":
        return st.sampled_from(["UTC", "Europe/Berlin", "America/New_York"])
    if name == "except":
        return st.sampled_from(["[2026-12-24]", "[]", '["2027-01-01"]'])
    return SCALAR


def _pairs(keys: list[str]) -> st.SearchStrategy[list[tuple[str, str]]]:
    """``key: value`` pairs: mostly distinct known keys with plausible values, sometimes
    a repeated key (duplicate keys), an unknown one, or any value."""
    pair = mostly(st.sampled_from(keys), st.just("bogus")).flatmap(
        lambda key: st.tuples(st.just(key), mostly(_good(key), SCALAR))
    )
    return mostly(
        st.lists(pair, max_size=6, unique_by=lambda kv: kv[0]), st.lists(pair, max_size=6)
    )


DEFAULTS = _pairs(sorted(Defaults.model_fields))
QUEUE = _pairs(sorted(QueueConfig.model_fields))
THRESHOLDS = _pairs(["compute_pct", "memory"]).map(_flow)


@st.composite
def window(draw: st.DrawFn, index: int) -> str:
    kind = draw(mostly(st.sampled_from(["cron", "lull", "blackout"]), st.just("tide")))
    name = draw(mostly(st.just(f"w{index}"), st.sampled_from(["-bad", "w0"])))
    pairs = [("name", name), ("kind", kind)]
    if kind in ("cron", "blackout"):
        pairs.append(("schedule", draw(CRON)))
        ends = draw(
            mostly(
                st.sampled_from([["duration"], ["until"]]),
                st.sampled_from([[], ["duration", "until"]]),  # exactly one is required
            )
        )
        if "duration" in ends:
            pairs.append(("duration", draw(mostly(st.sampled_from(["1s", "9h", "31d"]), SCALAR))))
        if "until" in ends:
            pairs.append(("until", draw(st.sampled_from(['"07:00"', "07:00", '"25:00"', "x"]))))
        keys = sorted({*CronWindow.model_fields, "except"} - {"except_", "kind", "name"})
    else:
        pairs += [
            ("below", draw(THRESHOLDS)),
            ("close_above", draw(THRESHOLDS)),
            ("for", draw(mostly(_good("for"), SCALAR))),
        ]
        keys = sorted({*LullWindow.model_fields, "for"} - {"for_", "kind", "name"})
    pairs += draw(_pairs([k for k in keys if k not in {p[0] for p in pairs}]))
    return _flow(pairs)


@st.composite
def policy_text(draw: st.DrawFn) -> str:
    """A policy file in block style at the top, flow style below, sometimes anchored."""
    lines = []
    if draw(st.booleans()):
        lines.append(f"apiVersion: {draw(mostly(st.just('ebbtide/v1'), YAML_WORDS))}")
    section = mostly(
        st.sampled_from(["defaults", "queues", "windows", "devices", "admins"]), st.just("bogus")
    )
    sections = draw(
        mostly(st.lists(section, max_size=5, unique=True), st.lists(section, max_size=5))
    )
    for section in sections:
        anchor = " &a" if draw(st.integers(0, 9)) == 9 else ""
        if section == "defaults":
            body = draw(DEFAULTS)
            if draw(st.booleans()):  # block style
                lines.append(f"defaults:{anchor}")
                lines += [f"  {k}: {v}" for k, v in body]
                continue
            lines.append(f"defaults:{anchor} {_flow(body)}")
        elif section == "queues":
            name = mostly(st.sampled_from(["default", "gpu"]), st.sampled_from(["a b", "yes", "1"]))
            names = draw(st.lists(name, max_size=3, unique=True))
            queues = [(name, _flow(draw(QUEUE))) for name in names]
            lines.append(f"queues:{anchor} {_flow(queues)}")
        elif section == "windows":
            count = draw(st.integers(0, 3))
            lines.append("windows:" if count else "windows: []")
            lines += [f"  - {draw(window(i))}" for i in range(count)]
        elif section == "devices":
            lines.append(f"devices: {{pools: {{p: [{draw(SCALAR)}]}}}}")
        elif section == "admins":
            lines.append(f"admins: [{', '.join(draw(st.lists(SCALAR, max_size=3)))}]")
        else:
            lines.append(f"bogus: {draw(SCALAR)}")
    if any("&a" in line for line in lines):
        key = "bogus" if "admins" in sections else "admins"
        lines.append(f"{key}: {draw(st.sampled_from(['*a', '[*a, *a]', '*b']))}")
    return "\n".join(lines) + "\n"


def _check(text: str) -> None:
    try:
        policy = parse_policy(text, FILE)
    except ConfigError as exc:
        for line in str(exc).splitlines():
            assert LINE.match(line), line
        return
    assert_policy_in_bounds(policy)


@fuzz(400)
@given(policy_text())
def test_structured_policies(text: str) -> None:
    _check(text)


WINDOW_BASE = {
    "cron": "{name: w, kind: cron, schedule: '0 22 * * *', duration: 9h, FIELD: VALUE}",
    "lull": "{name: w, kind: lull, below: {compute_pct: 10, memory: 1GiB}, for: 1m,"
    " close_above: {compute_pct: 50, memory: 2GiB}, FIELD: VALUE}",
}
#: Policies valid but for one field, whose value is left as ``VALUE``.
ONE_FIELD = st.one_of(
    st.sampled_from(sorted(Defaults.model_fields)).map(
        lambda k: "defaults: {FIELD: VALUE}".replace("FIELD", k)
    ),
    st.sampled_from(sorted(QueueConfig.model_fields)).map(
        lambda k: "queues: {gpu: {FIELD: VALUE}}".replace("FIELD", k)
    ),
    st.sampled_from(["duration", "until", "timezone", "schedule", "max_offline_share"]).map(
        lambda k: "windows:\n  - " + WINDOW_BASE["cron"].replace("FIELD", k)
    ),
    st.sampled_from(["for", "below", "close_above", "max_offline_share"]).map(
        lambda k: "windows:\n  - " + WINDOW_BASE["lull"].replace("FIELD", k)
    ),
)


@fuzz(400)
@given(ONE_FIELD, st.one_of(YAML_WORDS, SCALAR, CRON))
def test_one_field_any_value(template: str, value: str) -> None:
    """Every field of an otherwise valid policy, set to anything at all."""
    if "duration: 9h, duration:" in template or "duration: 9h, until:" in template:
        template = template.replace("duration: 9h, ", "")
    _check(template.replace("VALUE", value) + "\n")


YAML_TOKENS = st.sampled_from(
    [
        "a",
        "defaults",
        "queues",
        "windows",
        "deadline_s",
        ":",
        ": ",
        "- ",
        "-",
        "\n",
        "  ",
        "\t",
        "[",
        "]",
        "{",
        "}",
        ",",
        "'",
        '"',
        "&a ",
        "*a",
        "<<: ",
        "!!",
        "!tag ",
        "? ",
        "|",
        ">",
        "#",
        "%YAML 1.1\n",
        "---\n",
        "...\n",
        "\\",
        "\0",
        "\x07",
        "\ufeff",
        "é",
        "yes",
        ".inf",
        "1e400",
        "9" * 30,
    ]
)


@fuzz(400)
@given(
    st.one_of(
        st.text(max_size=80),
        st.lists(YAML_TOKENS, max_size=40).map("".join),
        st.lists(st.one_of(YAML_TOKENS, st.text(max_size=4)), max_size=30).map("".join),
    )
)
def test_garbage(text: str) -> None:
    _check(text)


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-policy") / "ebbtide.yaml"


@fuzz(100)
@given(data=st.binary(max_size=200))
def test_policy_files_of_random_bytes(policy_file: Path, data: bytes) -> None:
    policy_file.write_bytes(data)
    try:
        policy = load_policy(policy_file)
    except ConfigError as exc:
        assert str(exc).startswith(str(policy_file))
        return
    assert_policy_in_bounds(policy)
