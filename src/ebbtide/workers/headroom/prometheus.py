"""Headroom read from NVIDIA's DCGM exporter, through Prometheus or from the exporter itself.

(Longer than our modules should be: it is one source over one vendor's figures (DCGM,
through Prometheus or the exporter), and its parts (endpoints, queries, parsing both
answers' shapes, per-device figures) are steps of the one read.)

For nodes where the agent cannot use per-process NVML.  The figures are device level and
typically 30 s old (the exporter's default collection interval), so they serve for
**planning only**: every sample has ``eviction_trigger=False`` and
``basis=ComputeBasis.PLANNING``.

Spec forms (``--headroom prometheus:URL``):

- ``prometheus:http://HOST:9090`` — a Prometheus server that scrapes the exporter (any
  path is taken as the server's route prefix);
- ``prometheus:http://HOST:9400/metrics`` — a URL whose path ends in ``/metrics``: the
  exporter's own page, in Prometheus text format;
- either with ``?LABEL=VALUE&…`` selectors that pick this node's series, e.g.
  ``prometheus:http://prom:9090?Hostname=gpu-a``.  Without them, the ``node_labels``
  given to :class:`PrometheusSource` apply (the agent passes ``Hostname`` = its node
  name, ``--node``); without those, a Prometheus server is asked for ``Hostname`` = this
  machine's host name, and an exporter's page is read whole.

Per device (a GPU, or a MIG instance: one with a ``GPU_I_ID`` label) and per sample:

- **online memory** = ``DCGM_FI_DEV_FB_USED`` − the memory granted to ebbtide's slices
  on the device (``offline.granted_memory_mib``), never below 0;
- **online compute** = the device's utilisation − the compute granted to ebbtide's
  slices (``offline.granted_compute_pct``), never below 0; the utilisation is
  ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` × 100 where the exporter reports it, else
  ``DCGM_FI_DEV_GPU_UTIL``; a device with neither counts as fully busy;
- ``offline_compute_pct``/``offline_memory_mib`` are the granted figures.

DCGM cannot tell processes apart, so ebbtide's own jobs are taken to use exactly what
their slices were granted.  The online figures are therefore right, or err towards the
online side (less headroom: the safe side), only when offline jobs use their whole slice
(or more: compute is not capped); when they use less, online usage is understated by the
unused part of their slices, which the scheduler's planning margin must cover.

Device memory is ``FB_USED + FB_FREE`` (+ ``DCGM_FI_DEV_FB_RESERVED`` when reported).
Devices are learned at the first fetch and numbered 0..n−1 in (``gpu``, ``GPU_I_ID``)
order; that numbering holds for the life of the source (later devices are ignored).  A
sample's ``time`` is the timestamp Prometheus stored with the metrics it comes from (the
oldest of them; the query asks for raw samples, because an instant query stamps its
answers with the evaluation time), or the fetch time when reading the exporter directly
(or the page's own timestamps, if it has them).  Figures older than ``stale_after_s``
give ``ok=False`` samples with the worst case (online compute 100, online memory the
whole device), and :meth:`PrometheusSource.check` says why.

Faults come from ``DCGM_FI_DEV_XID_ERRORS`` (the last XID the device raised): a change to
a new non-zero value is a new fault; the value at the first fetch is the baseline.  The
same XID raised twice in a row cannot be seen, and an XID of a MIG-enabled GPU shows on
each of its instances.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from ebbtide.errors import UserError
from ebbtide.workers.headroom.base import (
    NO_OFFLINE,
    ComputeBasis,
    DeviceFault,
    DeviceInfo,
    DeviceSample,
    Offline,
    RecoveryAction,
)
from ebbtide.workers.headroom.xid import LOST_XIDS, disables_device, xid_meaning

log = logging.getLogger("ebbtide.headroom")

#: seconds between two fetches, by default
DEFAULT_REFRESH_S = 5.0
#: figures older than this, in seconds, are not trusted (samples go worst-case)
DEFAULT_STALE_AFTER_S = 120.0
#: how long one HTTP request may wait for the endpoint, in seconds
FETCH_TIMEOUT_S = 5.0

FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"
GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"
#: the DCGM exporter metrics this source reads
METRICS = (FB_USED, FB_FREE, FB_RESERVED, GR_ENGINE_ACTIVE, GPU_UTIL, XID_ERRORS)

#: DCGM's smallest "no value" sentinel (``DCGM_INT32_BLANK``; the 64-bit blanks are larger)
DCGM_BLANK_MIN = 0x7FFFFFF0

PROMETHEUS_FORMS = (
    "prometheus:http://HOST:9090 (a Prometheus server) or "
    "prometheus:http://HOST:9400/metrics (a DCGM exporter), "
    "optionally with ?LABEL=VALUE selectors (e.g. ?Hostname=gpu-a)"
)

_LABEL_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

#: a device as DCGM names it: (``gpu`` index, ``GPU_I_ID`` or ``None`` for a whole GPU)
_Key = tuple[int, int | None]


class PrometheusUnavailable(UserError):
    """The DCGM metrics cannot be read: the endpoint does not answer, or has none for this node."""


class _BadAnswer(Exception):
    """The endpoint answered, but not with what was asked."""


def _bad(url: str, why: str) -> ValueError:
    return ValueError(f"--headroom {'prometheus:' + url!r}: {why}; expected {PROMETHEUS_FORMS}")


@dataclass(frozen=True)
class Endpoint:
    """Where the DCGM metrics are read, as a ``prometheus:URL`` spec names it."""

    #: what is fetched: the exporter's page, or the Prometheus server's base URL (no selectors)
    url: str
    #: True: a DCGM exporter's own page; False: a Prometheus server's HTTP API
    exporter: bool
    #: the label selectors of the URL's query string, in order
    selectors: tuple[tuple[str, str], ...] = ()


def _check_label(url: str, name: str, value: str) -> None:
    if not _LABEL_RE.match(name) or name.startswith("__"):
        raise _bad(url, f"{name!r} is not a label name")
    if not value:
        raise _bad(url, f"the selector {name} has no value")


def parse_endpoint(url: str) -> Endpoint:
    """Read the URL of a ``prometheus:URL`` spec.  Raises ``ValueError`` naming the forms."""
    text = url.strip()
    if not text:
        raise _bad(url, "prometheus needs a URL")
    try:
        parts = urllib.parse.urlsplit(text)
        parts.port  # noqa: B018 -- raises ValueError on a bad port
    except ValueError as exc:
        raise _bad(url, f"cannot read the URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise _bad(url, "the URL must start with http:// or https://")
    if not parts.hostname:
        raise _bad(url, "the URL names no host")
    if parts.username is not None or parts.password is not None:
        raise _bad(url, "credentials in the URL are not supported")
    if parts.fragment:
        raise _bad(url, "the URL must not have a #fragment")
    path = parts.path.rstrip("/")
    if "/api/" in path + "/":
        raise _bad(url, "give the Prometheus server's base URL, not an API path")
    selectors: list[tuple[str, str]] = []
    if parts.query:
        try:
            pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True, strict_parsing=True)
        except ValueError:
            raise _bad(url, f"cannot read the selectors {parts.query!r}") from None
        for name, value in pairs:
            _check_label(url, name, value)
            if any(name == seen for seen, _ in selectors):
                raise _bad(url, f"the selector {name} is given twice")
            selectors.append((name, value))
    base = urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    return Endpoint(base, path.endswith("/metrics"), tuple(selectors))


def describe_selectors(selectors: Mapping[str, str]) -> str:
    """``{Hostname="gpu-a"}`` (``no label selector`` when empty)."""
    if not selectors:
        return "no label selector"
    return (
        "{"
        + ",".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in selectors.items())
        + "}"
    )


def promql(selectors: Mapping[str, str], window_s: int) -> str:
    """The query: every sample of :data:`METRICS` of the last ``window_s`` seconds."""
    matchers = [f'__name__=~"{"|".join(METRICS)}"']
    matchers += [f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in selectors.items()]
    return "{" + ",".join(matchers) + f"}}[{window_s}s]"


@dataclass(frozen=True)
class _Point:
    name: str
    labels: Mapping[str, str]
    value: float
    time: float


def _prometheus_points(body: str) -> list[_Point]:
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise _BadAnswer(f"the answer is not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        error = doc.get("error") if isinstance(doc, dict) else None
        raise _BadAnswer(f"Prometheus answered an error: {error or body[:200]}")
    points = []
    try:
        data = doc["data"]
        if data["resultType"] != "matrix":
            raise _BadAnswer(f"expected a matrix, Prometheus answered a {data['resultType']}")
        for series in data["result"]:
            labels, values = series["metric"], series["values"]
            if values:
                stamp, text = values[-1]
                points.append(_Point(labels["__name__"], labels, float(text), float(stamp)))
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise _BadAnswer(
            f"unexpected answer from Prometheus ({type(exc).__name__}: {exc})"
        ) from None
    return points


def _exporter_points(body: str, fetched_at: float) -> list[_Point]:
    points = []
    try:
        for family in text_string_to_metric_families(body):
            if family.name not in METRICS:
                continue
            for s in family.samples:
                stamp = fetched_at if s.timestamp is None else float(s.timestamp)
                points.append(_Point(family.name, s.labels, float(s.value), stamp))
    except ValueError as exc:
        raise _BadAnswer(f"cannot parse the metrics page ({exc})") from None
    return points


def _device_key(labels: Mapping[str, str]) -> _Key | None:
    try:
        gpu = int(labels["gpu"])
        instance = labels.get("GPU_I_ID", "")
        return gpu, (int(instance) if instance else None)
    except (KeyError, ValueError):
        return None


def _group(points: list[_Point], selectors: Mapping[str, str]) -> dict[_Key, dict[str, _Point]]:
    """Per device, the newest point of each metric (blank values and other nodes left out)."""
    out: dict[_Key, dict[str, _Point]] = {}
    for p in points:
        if not (math.isfinite(p.value) and 0 <= p.value < DCGM_BLANK_MIN):
            continue
        if any(p.labels.get(k) != v for k, v in selectors.items()):
            continue
        key = _device_key(p.labels)
        if key is None:
            continue
        metrics = out.setdefault(key, {})
        old = metrics.get(p.name)
        if old is None or p.time > old.time:
            metrics[p.name] = p
    # a MIG-enabled GPU's own series would count its instances twice
    mig = {gpu for gpu, instance in out if instance is not None}
    return {k: v for k, v in out.items() if not (k[1] is None and k[0] in mig)}


@dataclass(frozen=True)
class _Figures:
    #: Unix seconds: the oldest of the samples these figures come from
    time: float
    used_mib: float
    #: device utilisation in percent; ``None``: the exporter reports none
    compute_pct: float | None


def _figures(metrics: Mapping[str, _Point]) -> _Figures | None:
    used, free = metrics.get(FB_USED), metrics.get(FB_FREE)
    if used is None or free is None:
        return None
    times = [used.time, free.time]
    compute_pct = None
    if (active := metrics.get(GR_ENGINE_ACTIVE)) is not None:
        compute_pct = min(active.value, 1.0) * 100.0
        times.append(active.time)
    elif (util := metrics.get(GPU_UTIL)) is not None:
        compute_pct = min(util.value, 100.0)
        times.append(util.time)
    return _Figures(min(times), used.value, compute_pct)


def _device_info(index: int, key: _Key, metrics: Mapping[str, _Point]) -> DeviceInfo:
    labels = metrics[FB_USED].labels
    total = sum(metrics[m].value for m in (FB_USED, FB_FREE, FB_RESERVED) if m in metrics)
    model = labels.get("modelName") or "unknown GPU"
    gpu, instance = key
    if instance is None:
        uuid = labels.get("UUID") or labels.get("uuid") or None
        return DeviceInfo(index, memory_mib=round(total), name=model, uuid=uuid)
    profile = labels.get("GPU_I_PROFILE")
    # the exporter's UUID label is the parent GPU's, not the instance's MIG-… UUID
    return DeviceInfo(
        index,
        memory_mib=round(total),
        name=f"{model} MIG {profile}" if profile else f"{model} MIG",
        mig_parent=gpu,
        mig_gpu_instance=instance,
    )


def _why(exc: BaseException, timeout_s: float) -> str:
    """Why a fetch failed, in a few words."""
    if isinstance(exc, urllib.error.URLError):
        if not isinstance(exc.reason, BaseException):
            return str(exc.reason)
        exc = exc.reason
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


#: what a failed fetch raises (anything else is a bug, logged with its traceback)
_FETCH_ERRORS = (_BadAnswer, OSError, http.client.HTTPException)


def _error_detail(exc: urllib.error.HTTPError) -> str:
    """``: <Prometheus's error message>`` from an HTTP error's body, if it has one."""
    try:
        body = exc.read()
    except (OSError, http.client.HTTPException):
        return ""
    finally:
        exc.close()
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return ""
    return f": {error}" if error else ""


def _key_text(key: _Key) -> str:
    gpu, instance = key
    return f"gpu {gpu}" if instance is None else f"gpu {gpu} GPU_I_ID {instance}"


class PrometheusSource:
    """Online usage on this node's devices from DCGM exporter metrics (see the module doc).

    ``url`` is what follows ``prometheus:`` in the spec.  ``node_labels`` select this
    node's series when the URL has no ``?LABEL=VALUE`` selectors (default: ``Hostname`` =
    this machine's host name for a Prometheus server, none for an exporter's page).

    The constructor fetches once, waiting up to ``timeout_s`` seconds, to learn the
    devices; a background thread then fetches every ``refresh_s`` seconds, and
    :meth:`sample` returns the latest figures without waiting on the network.  ``clock``
    gives Unix seconds: the fetch time of an exporter's page, and the age of the data in
    :meth:`check`.  Raises ``ValueError`` on a bad URL, and :class:`PrometheusUnavailable`
    when the endpoint cannot be read or has no DCGM metrics for this node.
    """

    def __init__(
        self,
        url: str,
        *,
        node_labels: Mapping[str, str] | None = None,
        refresh_s: float = DEFAULT_REFRESH_S,
        stale_after_s: float = DEFAULT_STALE_AFTER_S,
        timeout_s: float = FETCH_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._endpoint = parse_endpoint(url)
        for name, value in (
            ("refresh_s", refresh_s),
            ("stale_after_s", stale_after_s),
            ("timeout_s", timeout_s),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        self._selectors = self._choose_selectors(url, node_labels)
        self._refresh_s = float(refresh_s)
        self._stale_after_s = float(stale_after_s)
        self._timeout_s = float(timeout_s)
        self._clock = clock
        # built here, so that proxy settings are read once, at start
        self._opener = urllib.request.build_opener()
        self._lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._stop = threading.Event()
        self._faults: list[DeviceFault] = []
        #: devices with an XID that took them out of service: DCGM's figures cannot show
        #: that they recovered (its XID field keeps the last one), so checks keep failing
        #: and an admin returns them (``ebb node undrain``)
        self._unverifiable: dict[int, int] = {}
        #: why the last fetch failed (``None``: it did not)
        self._error: str | None = None
        self._closed = False
        self._ignored: set[_Key] = set()
        #: per device index: the last XID value seen, and the time of its sample
        self._xids: dict[int, tuple[int, float]] = {}
        try:
            grouped = self._fetch()
        except _FETCH_ERRORS as exc:
            raise PrometheusUnavailable(
                f"cannot read DCGM metrics from {self._endpoint.url} ({self.selector}): "
                f"{_why(exc, self._timeout_s)}"
            ) from None
        self._learn(grouped)
        self._apply(grouped)
        self._thread = threading.Thread(target=self._run, name="ebbtide-dcgm-fetch", daemon=True)
        self._thread.start()

    def _choose_selectors(self, url: str, node_labels: Mapping[str, str] | None) -> dict[str, str]:
        if self._endpoint.selectors:
            return dict(self._endpoint.selectors)
        if node_labels is not None:
            for name, value in node_labels.items():
                _check_label(url, name, value)
            return dict(node_labels)
        if self._endpoint.exporter:
            return {}
        return {"Hostname": socket.gethostname()}

    def _learn(self, grouped: Mapping[_Key, Mapping[str, _Point]]) -> None:
        figures = {key: f for key, metrics in grouped.items() if (f := _figures(metrics))}
        if not figures:
            what = f"no device with both {FB_USED} and {FB_FREE}" if grouped else "no DCGM metrics"
            raise PrometheusUnavailable(
                f"{self._endpoint.url} has {what} for {self.selector}; is the DCGM exporter "
                "running (and scraped), and do its series carry these labels? "
                "Pick this node's series with prometheus:URL?LABEL=VALUE (e.g. ?Hostname=NODE)"
            )
        keys = sorted(figures, key=lambda k: (k[0], -1 if k[1] is None else k[1]))
        self._index = {key: index for index, key in enumerate(keys)}
        self._devices = [_device_info(i, key, grouped[key]) for i, key in enumerate(keys)]
        self._latest = [figures[key] for key in keys]

    @property
    def endpoint(self) -> Endpoint:
        return self._endpoint

    @property
    def selector(self) -> str:
        """The labels this node's series are picked by, e.g. ``{Hostname="gpu-a"}``."""
        return describe_selectors(self._selectors)

    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    def _get(self, url: str, accept: str) -> str:
        request = urllib.request.Request(url, headers={"Accept": accept})
        try:
            with self._opener.open(request, timeout=self._timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise _BadAnswer(f"HTTP {exc.code} {exc.reason}{_error_detail(exc)}") from None
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _BadAnswer(f"the answer is not UTF-8 ({exc})") from None

    def _fetch(self) -> dict[_Key, dict[str, _Point]]:
        if self._endpoint.exporter:
            body = self._get(self._endpoint.url, "text/plain")
            points = _exporter_points(body, self._clock())
        else:
            window_s = math.ceil(self._stale_after_s)
            query = urllib.parse.urlencode({"query": promql(self._selectors, window_s)})
            body = self._get(f"{self._endpoint.url}/api/v1/query?{query}", "application/json")
            points = _prometheus_points(body)
        return _group(points, self._selectors)

    def refresh(self) -> bool:
        """Fetch now, waiting up to ``timeout_s``; the background thread calls this every
        ``refresh_s``.  Returns whether it worked; a failure is logged once per outage."""
        with self._refresh_lock:
            try:
                grouped = self._fetch()
                if not grouped.keys() & self._index.keys():
                    raise _BadAnswer(f"no DCGM metrics for {self.selector}")
            except Exception as exc:
                self._failed(exc)
                return False
            self._apply(grouped)
        with self._lock:
            was, self._error = self._error, None
        if was is not None:
            log.info("DCGM metrics from %s readable again", self._endpoint.url)
        return True

    def _failed(self, exc: Exception) -> None:
        why = _why(exc, self._timeout_s)
        with self._lock:
            first, self._error = self._error is None, why
        if first:
            log.warning(
                "cannot read DCGM metrics from %s: %s; retrying every %g s "
                "(headroom figures turn worst-case after %g s without data)",
                self._endpoint.url,
                why,
                self._refresh_s,
                self._stale_after_s,
                exc_info=None if isinstance(exc, _FETCH_ERRORS) else exc,
            )

    def _apply(self, grouped: Mapping[_Key, Mapping[str, _Point]]) -> None:
        new: list[_Key] = []
        with self._lock:
            for key, metrics in grouped.items():
                index = self._index.get(key)
                if index is None:
                    if key not in self._ignored:
                        self._ignored.add(key)
                        new.append(key)
                    continue
                figures = _figures(metrics)
                if figures is not None and figures.time >= self._latest[index].time:
                    self._latest[index] = figures
                if (xid := metrics.get(XID_ERRORS)) is not None:
                    self._see_xid(index, xid)
        for key in new:
            log.warning(
                "DCGM reports %s, which was not there at start: ignored until restart",
                _key_text(key),
            )

    def _see_xid(self, index: int, point: _Point) -> None:
        """Note the XID value of one device (with ``self._lock`` held)."""
        xid = int(point.value)
        last = self._xids.get(index)
        if last is not None and point.time < last[1]:
            return  # an answer older than the one already seen
        self._xids[index] = (xid, point.time)
        if last is None or xid == last[0] or xid == 0:
            return
        unknown = RecoveryAction.UNKNOWN
        if disables_device(xid, unknown):
            self._unverifiable[index] = xid
        self._faults.append(
            DeviceFault(
                index=index,
                time=point.time,
                xid=xid,
                meaning=xid_meaning(xid),
                recovery_action=unknown.value,
                lost=xid in LOST_XIDS,
                disabling=disables_device(xid, unknown),
            )
        )

    def _run(self) -> None:
        while not self._stop.wait(self._refresh_s):
            self.refresh()

    def sample(self, now: float, offline: Offline = NO_OFFLINE) -> list[DeviceSample]:
        """The latest figures (never waits on the network); ``ok=False`` and the worst case
        for a device whose figures are older than ``stale_after_s`` at ``now``."""
        with self._lock:
            latest = list(self._latest)
        out = []
        for device, figures in zip(self._devices, latest, strict=True):
            granted_pct = offline.granted_compute_pct(device.index)
            granted_mib = offline.granted_memory_mib(device.index)
            stale = now - figures.time > self._stale_after_s
            if stale:
                compute_pct, memory_mib = 100.0, float(device.memory_mib)
            else:
                busy_pct = 100.0 if figures.compute_pct is None else figures.compute_pct
                compute_pct = max(0.0, busy_pct - granted_pct)
                memory_mib = max(0.0, figures.used_mib - granted_mib)
            out.append(
                DeviceSample(
                    index=device.index,
                    time=now if stale else figures.time,
                    online_compute_pct=compute_pct,
                    online_memory_mib=memory_mib,
                    offline_compute_pct=granted_pct,
                    offline_memory_mib=granted_mib,
                    basis=ComputeBasis.PLANNING.value,
                    eviction_trigger=False,
                    ok=not stale,
                )
            )
        return out

    def faults(self) -> list[DeviceFault]:
        with self._lock:
            out, self._faults = self._faults, []
        return out

    def check(self, index: int) -> str | None:
        """``None`` while device ``index`` has figures younger than ``stale_after_s`` and
        no XID that took it out of service (DCGM cannot show that it recovered)."""
        if not 0 <= index < len(self._devices):
            return f"no device with index {index} (devices: 0–{len(self._devices) - 1})"
        with self._lock:
            figures, error = self._latest[index], self._error
            xid = self._unverifiable.get(index)
        if xid is not None:
            return (
                f"XID {xid} seen in DCGM figures, which cannot show a recovery: "
                "return the device with `ebb node undrain` once it is fixed"
            )
        age_s = self._clock() - figures.time
        if age_s <= self._stale_after_s:
            return None
        why = f"no DCGM data for {age_s:.0f} s from {self._endpoint.url}"
        return f"{why} ({error})" if error else why

    def close(self) -> None:
        """Stop the background thread; waits for a fetch in flight (at most ``timeout_s``)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join()
