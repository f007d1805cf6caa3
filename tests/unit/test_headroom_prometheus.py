"""The ``prometheus:URL`` headroom source against a real local HTTP server that serves a
DCGM exporter page (``/metrics``) and a Prometheus HTTP API (``/api/v1/query``) over it."""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from ebbtide.errors import UserError
from ebbtide.workers.headroom.base import ComputeBasis, DeviceFault, HeadroomSource, KnownPids
from ebbtide.workers.headroom.factory import open_source
from ebbtide.workers.headroom.prometheus import PrometheusSource, PrometheusUnavailable

#: when Prometheus last scraped the exporter, Unix seconds
T0 = 1_750_000_000.0
H100 = "NVIDIA H100 80GB HBM3"
#: an H100's FB_USED + FB_FREE + FB_RESERVED, in MiB
H100_MIB = 81_559
#: DCGM's "no value" for a float field (``DCGM_FP64_BLANK``)
FP64_BLANK = 140737488355328.0
#: generous bound for waiting on another thread; never reached when things work
PATIENCE_S = 30.0


@dataclass
class Gpu:
    """One device on the fake exporter's page (``None``: the exporter does not report it)."""

    gpu: int
    used_mib: float = 1_024
    free_mib: float = 80_006
    reserved_mib: float | None = 529
    util_pct: float | None = 0
    active: float | None = None
    xid: int = 0
    hostname: str = "gpu-a"
    instance: int | None = None
    profile: str | None = None

    def labels(self) -> dict[str, str]:
        labels = {
            "gpu": str(self.gpu),
            "UUID": f"GPU-5c3b1f2e-8d4a-4c1e-9f7b-{self.gpu:012x}",
            "pci_bus_id": f"00000000:{0x18 + 0x10 * self.gpu:02X}:00.0",
            "device": f"nvidia{self.gpu}",
            "modelName": H100,
        }
        if self.instance is not None:
            labels |= {"GPU_I_PROFILE": self.profile or "1g.10gb", "GPU_I_ID": str(self.instance)}
        return labels | {"Hostname": self.hostname, "DCGM_FI_DRIVER_VERSION": "550.54.15"}


#: the page's metrics in the exporter's order: name, type, help, value of a device
PAGE: list[tuple[str, str, str, Callable[[Gpu], float | None]]] = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", lambda g: 1980),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", lambda g: 2619),
    (
        "DCGM_FI_DEV_MEMORY_TEMP",
        "gauge",
        "Memory temperature (in C).",
        lambda g: 9.223372036854776e18,
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", lambda g: 34),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", lambda g: 71.339),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        lambda g: 5_032_104_711,
    ),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lambda g: g.util_pct),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", lambda g: 0),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "Value of the last XID error encountered.",
        lambda g: g.xid,
    ),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", lambda g: g.free_mib),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", lambda g: g.used_mib),
    (
        "DCGM_FI_DEV_FB_RESERVED",
        "gauge",
        "Framebuffer memory reserved (in MiB).",
        lambda g: g.reserved_mib,
    ),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        lambda g: g.active,
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        lambda g: 0.0,
    ),
]

_MATCHER_RE = re.compile(r'(\w+)(=~|=)"((?:[^"\\]|\\.)*)"')


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and value < 1e15 else f"{value:.6f}"


class FakeDcgm:
    """What the server serves; tests change it between fetches."""

    def __init__(self, gpus: list[Gpu]) -> None:
        self.gpus = gpus
        #: Prometheus's timestamp of the newest scrape
        self.scraped_at = T0
        #: answer every request with this HTTP status (a Prometheus error body)
        self.fail: int | None = None
        #: answer every request with this body instead
        self.garbage: str | None = None
        #: hold every request until ``release`` is set
        self.hanging = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self.queries: list[str] = []
        self.url = ""

    def series(self) -> Iterator[tuple[str, str, str, dict[str, str], float]]:
        for name, kind, help_text, value_of in PAGE:
            for gpu in self.gpus:
                value = value_of(gpu)
                if value is not None:
                    yield name, kind, help_text, gpu.labels(), value

    def page(self) -> str:
        lines: list[str] = []
        for name, kind, help_text, labels, value in self.series():
            if f"# TYPE {name} {kind}" not in lines:
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.append(f"{name}{{{text}}} {_number(value)}")
        return "\n".join(lines) + "\n"

    def prometheus(self, query: str) -> dict[str, Any]:
        """A range-vector selector over the page, as Prometheus answers it (raw samples)."""
        self.queries.append(query)
        names: set[str] = set()
        wanted: dict[str, str] = {}
        for label, op, text in _MATCHER_RE.findall(query):
            value = json.loads(f'"{text}"')
            if label == "__name__" and op == "=~":
                names = set(value.split("|"))
            else:
                wanted[label] = value
        result = []
        for name, _, _, labels, value in self.series():
            if name in names and all(labels.get(k) == v for k, v in wanted.items()):
                metric = {"__name__": name, **labels, "instance": "10.0.3.7:9400", "job": "gpu"}
                values = [[self.scraped_at - 15, "0"], [self.scraped_at, _number(value)]]
                result.append({"metric": metric, "values": values})
        return {"status": "success", "data": {"resultType": "matrix", "result": result}}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    fake: FakeDcgm


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        fake = self.server.fake
        if fake.hanging:
            fake.entered.set()
            fake.release.wait(4 * PATIENCE_S)
        url = urllib.parse.urlsplit(self.path)
        if fake.fail is not None:
            error = {"status": "error", "errorType": "unavailable", "error": "TSDB not ready"}
            self._send(fake.fail, json.dumps(error), "application/json")
        elif fake.garbage is not None:
            self._send(200, fake.garbage, "text/html")
        elif url.path == "/metrics":
            self._send(200, fake.page(), "text/plain; version=0.0.4; charset=utf-8")
        elif url.path == "/api/v1/query":
            query = urllib.parse.parse_qs(url.query)["query"][0]
            self._send(200, json.dumps(fake.prometheus(query)), "application/json")
        else:
            self._send(404, "404 page not found\n", "text/plain")

    def _send(self, status: int, body: str, content_type: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def fake() -> Iterator[FakeDcgm]:
    dcgm = FakeDcgm([Gpu(0), Gpu(1)])
    server = _Server(("127.0.0.1", 0), _Handler)
    server.fake = dcgm
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    dcgm.url = f"http://127.0.0.1:{server.server_port}"
    yield dcgm
    dcgm.release.set()
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


Opener = Callable[..., PrometheusSource]


@pytest.fixture
def opened(fake: FakeDcgm, clock: Clock) -> Iterator[Opener]:
    """Opens sources that fetch only when told (``refresh()``), and closes them after."""
    sources: list[PrometheusSource] = []

    def open_(url: str, **kwargs: Any) -> PrometheusSource:
        kwargs.setdefault("refresh_s", 3600.0)
        kwargs.setdefault("clock", clock)
        source = PrometheusSource(url, **kwargs)
        sources.append(source)
        return source

    yield open_
    for source in sources:
        source.close()


@pytest.fixture(params=["prometheus", "exporter"])
def url(request: pytest.FixtureRequest, fake: FakeDcgm) -> str:
    """This node's DCGM metrics, through Prometheus or from the exporter's page."""
    if request.param == "prometheus":
        return f"{fake.url}?Hostname=gpu-a"
    return f"{fake.url}/metrics"


def figures(source: PrometheusSource, now: float, offline: Any = None) -> list[tuple[float, float]]:
    samples = source.sample(now) if offline is None else source.sample(now, offline)
    return [(s.online_compute_pct, s.online_memory_mib) for s in samples]


def test_learns_the_devices_from_prometheus(fake: FakeDcgm, opened: Opener) -> None:
    source = opened(f"{fake.url}?Hostname=gpu-a")
    devices = source.devices()
    assert [d.index for d in devices] == [0, 1]
    assert {d.memory_mib for d in devices} == {H100_MIB}
    assert {d.name for d in devices} == {H100}
    assert devices[1].uuid == "GPU-5c3b1f2e-8d4a-4c1e-9f7b-000000000001"
    assert {d.mig_parent for d in devices} == {None}
    [query] = fake.queries
    assert 'Hostname="gpu-a"' in query
    assert query.endswith("[120s]")
    assert source.endpoint.exporter is False
    assert source.selector == '{Hostname="gpu-a"}'


def test_learns_the_devices_from_the_exporter_page(fake: FakeDcgm, opened: Opener) -> None:
    source = opened(f"{fake.url}/metrics")
    assert [(d.index, d.memory_mib, d.name) for d in source.devices()] == [
        (0, H100_MIB, H100),
        (1, H100_MIB, H100),
    ]
    assert source.endpoint.exporter is True
    assert fake.queries == []


def test_online_usage_is_the_device_figure_minus_the_granted_slices(
    fake: FakeDcgm, opened: Opener, clock: Clock, url: str
) -> None:
    fake.gpus[0].used_mib, fake.gpus[0].util_pct = 30_000, 60
    fake.gpus[1].used_mib, fake.gpus[1].util_pct = 1_024, 5
    source = opened(url)
    granted = KnownPids(granted={0: (25.0, 20_000.0), 1: (50.0, 4_096.0)})
    samples = source.sample(T0 + 10, granted)
    assert [(s.online_compute_pct, s.online_memory_mib) for s in samples] == [
        (35.0, 10_000.0),
        (0.0, 0.0),  # never below zero
    ]
    assert [(s.offline_compute_pct, s.offline_memory_mib) for s in samples] == [
        (25.0, 20_000.0),
        (50.0, 4_096.0),
    ]
    assert {s.time for s in samples} == {T0}
    assert {(s.basis, s.eviction_trigger, s.ok) for s in samples} == {
        (ComputeBasis.PLANNING.value, False, True)
    }
    assert {s.offline_jobs for s in samples} == {None}  # device figures: nothing per job
    assert figures(source, T0 + 10) == [(60.0, 30_000.0), (5.0, 1_024.0)]


def test_gr_engine_active_is_preferred_over_gpu_util(
    fake: FakeDcgm, opened: Opener, url: str
) -> None:
    fake.gpus[0].util_pct, fake.gpus[0].active = 90, 0.25
    fake.gpus[1].util_pct, fake.gpus[1].active = 40, None
    assert [c for c, _ in figures(opened(url), T0)] == [25.0, 40.0]


def test_blank_values_are_no_values(fake: FakeDcgm, opened: Opener, url: str) -> None:
    fake.gpus[0].util_pct, fake.gpus[0].active = 70, FP64_BLANK
    fake.gpus[1].util_pct, fake.gpus[1].active = None, None
    # no utilisation at all counts as fully busy
    assert [c for c, _ in figures(opened(url), T0)] == [70.0, 100.0]


def test_refresh_reads_new_figures(fake: FakeDcgm, opened: Opener, clock: Clock, url: str) -> None:
    source = opened(url)
    fake.gpus[1].used_mib, fake.gpus[1].util_pct = 50_000, 80
    fake.scraped_at = clock.now = T0 + 30
    assert source.refresh() is True
    assert figures(source, T0 + 31) == [(0.0, 1_024.0), (80.0, 50_000.0)]
    assert {s.time for s in source.sample(T0 + 31)} == {T0 + 30}


def test_the_background_thread_fetches_every_refresh_s(fake: FakeDcgm, opened: Opener) -> None:
    source = opened(f"{fake.url}?Hostname=gpu-a", refresh_s=0.05)
    fake.gpus[0].used_mib = 12_345
    deadline = time.monotonic() + PATIENCE_S
    while figures(source, T0)[0][1] != 12_345.0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert figures(source, T0)[0] == (0.0, 12_345.0)


def test_a_prometheus_server_is_asked_for_this_host_by_default(
    fake: FakeDcgm, opened: Opener
) -> None:
    here = socket.gethostname()
    fake.gpus = [Gpu(0, hostname=here, used_mib=111), Gpu(0, hostname="elsewhere", used_mib=999)]
    source = opened(fake.url)
    assert figures(source, T0) == [(0.0, 111.0)]
    assert f"Hostname={json.dumps(here)}" in fake.queries[-1]


def test_node_labels_replace_the_default_and_spec_selectors_win(
    fake: FakeDcgm, opened: Opener
) -> None:
    fake.gpus = [Gpu(0, hostname="gpu-a", used_mib=111), Gpu(0, hostname="gpu-b", used_mib=222)]
    by_node_labels = opened(fake.url, node_labels={"Hostname": "gpu-b"})
    assert figures(by_node_labels, T0) == [(0.0, 222.0)]
    by_spec = opened(f"{fake.url}?Hostname=gpu-a", node_labels={"Hostname": "gpu-b"})
    assert figures(by_spec, T0) == [(0.0, 111.0)]
    assert by_spec.selector == '{Hostname="gpu-a"}'


def test_the_exporter_page_is_filtered_by_the_selectors(fake: FakeDcgm, opened: Opener) -> None:
    fake.gpus = [Gpu(0, hostname="gpu-a", used_mib=111), Gpu(1, hostname="gpu-b", used_mib=222)]
    assert figures(opened(f"{fake.url}/metrics"), T0) == [(0.0, 111.0), (0.0, 222.0)]
    assert figures(opened(f"{fake.url}/metrics?Hostname=gpu-b"), T0) == [(0.0, 222.0)]


def test_mig_instances_are_devices_in_gpu_then_instance_order(
    fake: FakeDcgm, opened: Opener, url: str
) -> None:
    def instance(gi: int, used_mib: float, active: float) -> Gpu:
        return Gpu(
            0,
            used_mib=used_mib,
            free_mib=40_192 - used_mib,
            reserved_mib=None,
            util_pct=None,
            active=active,
            instance=gi,
            profile="3g.40gb",
        )

    fake.gpus = [instance(2, 8_000, 0.5), Gpu(1, util_pct=10), instance(1, 100, 0.0)]
    source = opened(url)
    devices = source.devices()
    assert [(d.mig_parent, d.mig_gpu_instance) for d in devices] == [(0, 1), (0, 2), (None, None)]
    assert [d.memory_mib for d in devices] == [40_192, 40_192, H100_MIB]
    assert devices[0].name == f"{H100} MIG 3g.40gb"
    assert devices[0].uuid is None  # the exporter's UUID label is the parent GPU's
    assert figures(source, T0) == [(0.0, 100.0), (50.0, 8_000.0), (10.0, 1_024.0)]


def test_the_device_numbering_is_kept_across_fetches(
    fake: FakeDcgm, opened: Opener, clock: Clock, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    source = opened(url)
    before = source.devices()
    fake.gpus = [Gpu(2, used_mib=777), Gpu(1, used_mib=555)]  # 0 gone, 2 new, order changed
    fake.scraped_at = clock.now = T0 + 30
    with caplog.at_level(logging.WARNING, logger="ebbtide.headroom"):
        assert source.refresh() is True
        assert source.refresh() is True
    assert source.devices() == before
    samples = source.sample(T0 + 31)
    assert [(s.time, s.online_memory_mib) for s in samples] == [(T0, 1_024.0), (T0 + 30, 555.0)]
    [record] = caplog.records
    assert "gpu 2" in record.getMessage()


def test_a_new_xid_is_one_fault_and_the_first_value_is_the_baseline(
    fake: FakeDcgm, opened: Opener, clock: Clock, url: str
) -> None:
    fake.gpus[0].xid = 13
    source = opened(url)
    assert source.faults() == []

    def fetch(xid: int) -> list[DeviceFault]:
        fake.gpus[0].xid = xid
        fake.scraped_at = clock.now = clock.now + 30
        assert source.refresh() is True
        return source.faults()

    assert fetch(79) == [
        DeviceFault(
            index=0,
            time=T0 + 30,
            xid=79,
            meaning="XID 79: GPU has fallen off the bus",
            recovery_action="unknown",
            lost=True,
            disabling=True,
        )
    ]
    assert source.faults() == []
    assert fetch(79) == []
    assert fetch(0) == []
    [fault] = fetch(43)
    assert (fault.index, fault.xid, fault.lost, fault.disabling) == (0, 43, False, False)


def test_a_device_an_xid_took_out_is_returned_by_an_admin_not_by_its_checks(
    fake: FakeDcgm, opened: Opener, clock: Clock, url: str
) -> None:
    source = opened(url)

    def fetch(xid: int) -> None:
        fake.gpus[0].xid = xid
        fake.scraped_at = clock.now = clock.now + 30
        assert source.refresh() is True

    fetch(13)  # an application's own error: the device stays in service
    assert source.check(0) is None
    fetch(48)
    why = source.check(0)
    assert why is not None and "XID 48" in why and "ebb node undrain" in why
    assert source.check(1) is None  # the other device is fine


def test_stale_figures_are_the_worst_case_and_fail_the_check(
    fake: FakeDcgm, opened: Opener, clock: Clock, url: str
) -> None:
    source = opened(url)
    granted = KnownPids(granted={0: (25.0, 20_000.0)})
    clock.now = T0 + 100
    assert [s.ok for s in source.sample(T0 + 100, granted)] == [True, True]
    assert source.check(0) is None
    clock.now = T0 + 130
    stale = source.sample(T0 + 130, granted)
    assert [(s.ok, s.online_compute_pct, s.online_memory_mib) for s in stale] == [
        (False, 100.0, float(H100_MIB)),
        (False, 100.0, float(H100_MIB)),
    ]
    assert (stale[0].offline_compute_pct, stale[0].offline_memory_mib) == (25.0, 20_000.0)
    assert {(s.time, s.eviction_trigger) for s in stale} == {(T0 + 130, False)}
    base = url.split("?")[0]
    assert source.check(0) == f"no DCGM data for 130 s from {base}"
    assert source.check(7) == "no device with index 7 (devices: 0–1)"


def test_a_fetch_error_is_logged_once_per_outage(
    fake: FakeDcgm, opened: Opener, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    source = opened(f"{fake.url}?Hostname=gpu-a")
    caplog.set_level(logging.INFO, logger="ebbtide.headroom")
    fake.fail = 503
    assert source.refresh() is False
    assert source.refresh() is False
    [warning] = caplog.records
    assert warning.levelno == logging.WARNING
    assert "HTTP 503 Service Unavailable: TSDB not ready" in warning.getMessage()
    clock.now = T0 + 200
    assert source.check(0) == (
        f"no DCGM data for 200 s from {fake.url} (HTTP 503 Service Unavailable: TSDB not ready)"
    )
    fake.fail = None
    fake.scraped_at = T0 + 195
    assert source.refresh() is True
    assert source.check(0) is None
    assert "readable again" in caplog.records[-1].getMessage()
    fake.fail = 500
    assert source.refresh() is False
    assert [r.levelno for r in caplog.records] == [logging.WARNING, logging.INFO, logging.WARNING]


@pytest.mark.parametrize(
    ("path", "garbage", "why"),
    [
        ("?Hostname=gpu-a", "<html>login</html>", "not JSON"),
        ("?Hostname=gpu-a", '{"status": "success", "data": {"resultType": "vector"}}', "matrix"),
        ("/metrics", 'DCGM_FI_DEV_FB_USED{gpu="0"} lots\n', "cannot parse the metrics page"),
        ("/metrics", "# nothing\n", "no DCGM metrics for no label selector"),
    ],
)
def test_unexpected_answers_are_fetch_errors(
    fake: FakeDcgm,
    opened: Opener,
    caplog: pytest.LogCaptureFixture,
    path: str,
    garbage: str,
    why: str,
) -> None:
    source = opened(fake.url + path)
    fake.garbage = garbage
    with caplog.at_level(logging.WARNING, logger="ebbtide.headroom"):
        assert source.refresh() is False
    [record] = caplog.records
    assert why in record.getMessage()
    assert record.exc_info is None


def test_an_unreachable_endpoint_at_start_is_a_clear_error(opened: Opener) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(PrometheusUnavailable) as info:
        opened(f"http://127.0.0.1:{port}?Hostname=gpu-a")
    assert isinstance(info.value, UserError)
    message = str(info.value)
    assert f"cannot read DCGM metrics from http://127.0.0.1:{port}" in message
    assert '{Hostname="gpu-a"}' in message
    assert "refused" in message


@pytest.mark.parametrize("path", ["?Hostname=gpu-z", "/metrics?Hostname=gpu-z"])
def test_no_metrics_for_this_node_names_the_selector(
    fake: FakeDcgm, opened: Opener, path: str
) -> None:
    with pytest.raises(PrometheusUnavailable, match=r'no DCGM metrics for \{Hostname="gpu-z"\}'):
        opened(fake.url + path)


def test_devices_without_memory_figures_are_a_clear_error(fake: FakeDcgm, opened: Opener) -> None:
    fake.gpus = [Gpu(0, used_mib=FP64_BLANK)]
    with pytest.raises(PrometheusUnavailable, match="no device with both DCGM_FI_DEV_FB_USED"):
        opened(f"{fake.url}/metrics")


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("prometheus", "needs a URL"),
        ("prometheus:", "needs a URL"),
        ("prometheus:prom:9090", "http:// or https://"),
        ("prometheus:ftp://prom:9090", "http:// or https://"),
        ("prometheus:http://", "names no host"),
        ("prometheus:http://prom:port", "cannot read the URL"),
        ("prometheus:http://user:secret@prom:9090", "credentials"),
        ("prometheus:http://prom:9090#x", "fragment"),
        ("prometheus:http://prom:9090/api/v1/query", "base URL"),
        ("prometheus:http://prom:9090?Hostname", "cannot read the selectors"),
        ("prometheus:http://prom:9090?Hostname=", "has no value"),
        ("prometheus:http://prom:9090?host-name=a", "not a label name"),
        ("prometheus:http://prom:9090?__name__=up", "not a label name"),
        ("prometheus:http://prom:9090?Hostname=a&Hostname=b", "given twice"),
    ],
)
def test_bad_specs_name_the_accepted_forms(spec: str, why: str) -> None:
    with pytest.raises(ValueError) as info:
        open_source(spec, None)
    message = str(info.value)
    assert why in message
    assert "prometheus:http://HOST:9090" in message
    assert "prometheus:http://HOST:9400/metrics" in message


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"refresh_s": 0}, "refresh_s"),
        ({"stale_after_s": float("nan")}, "stale_after_s"),
        ({"timeout_s": -1}, "timeout_s"),
        ({"node_labels": {"host name": "a"}}, "not a label name"),
    ],
)
def test_bad_arguments_are_refused_before_any_fetch(
    fake: FakeDcgm, opened: Opener, kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        opened(fake.url, **kwargs)
    assert fake.queries == []


def test_sample_does_not_wait_on_a_hanging_server(fake: FakeDcgm, opened: Opener) -> None:
    # the fetch outlasts the wait below: the server holds it until released
    source = opened(f"{fake.url}?Hostname=gpu-a", refresh_s=0.05, timeout_s=8 * PATIENCE_S)
    before = source.sample(T0)
    fake.hanging = True
    assert fake.entered.wait(PATIENCE_S), "the background thread never fetched"
    got: list[Any] = []
    sampler = threading.Thread(target=lambda: got.append(source.sample(T0)))
    sampler.start()
    sampler.join(PATIENCE_S)
    finished = not sampler.is_alive()
    fake.release.set()
    sampler.join()
    assert finished, "sample() waited on the hanging server"
    assert got == [before]


def test_close_joins_the_thread_once(fake: FakeDcgm, opened: Opener) -> None:
    def fetchers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "ebbtide-dcgm-fetch"]

    source = opened(f"{fake.url}?Hostname=gpu-a", refresh_s=0.05)
    [thread] = fetchers()
    source.close()
    assert not thread.is_alive()
    assert fetchers() == []
    source.close()


def test_the_factory_opens_a_prometheus_source(fake: FakeDcgm) -> None:
    source: HeadroomSource = open_source(f"PROMETHEUS: {fake.url}?Hostname=gpu-a", None)
    try:
        assert isinstance(source, PrometheusSource)
        assert len(source.devices()) == 2
    finally:
        source.close()


def test_the_agent_asks_prometheus_for_its_own_node(monkeypatch: pytest.MonkeyPatch) -> None:
    from ebbtide.workers.headroom import factory

    seen: list[object] = []
    monkeypatch.setattr(
        factory, "PrometheusSource", lambda url, node_labels=None: seen.append((url, node_labels))
    )
    factory.open_source("prometheus:http://prom:9090", None, node="gpu-a")
    factory.open_source("prometheus:http://prom:9090?Hostname=x", None)
    assert seen == [
        ("http://prom:9090", {"Hostname": "gpu-a"}),
        ("http://prom:9090?Hostname=x", None),
    ]
