"""The packages of ``src/ebbtide`` form layers, and imports point one way: down.

Each module belongs to one component, and each component to one layer.  A module may
import modules of its own layer's components and of lower layers, never of a higher one;
and the components import each other without cycles.  Lowest first:

0. **base**: leaf modules with no domain in them (``errors``, ``units``, ``clock``,
   ``redaction``, ``scriptfile``, ``identity``, ``args``, ``attempt_logs``) and
   ``config.settings`` (the ``EBBTIDE_*`` variables: the store's and the broker's URLs).
1. **queue model**: what a job is (``queue.states``, ``spec``, ``models``), the rules
   that need no engine (``dependencies``, ``outcomes``, ``rightsizing``, ``purge``'s
   statements over a connection it is given) and the qsub/sbatch dialects that turn a
   command line into a ``JobSpec`` (``queue.qsub``, ``queue.slurm``: the CLI and the
   server's ``POST /qsub`` share them); the API a job imports (``job``, ``integrations``).
2. **scheduling core**: the pure planner and victim policy on a snapshot
   (``scheduling.snapshot``, ``capacity``, ``fit``, ``admission``, ``planner``,
   ``forecast``, ``cron``, and ``preemption``).  No clock reads, no I/O, and none of
   APScheduler, SQLAlchemy, Redis or dramatiq (:func:`test_pure_core_loads_no_backend`).
3. **config**: the policy file's schema, which turns the file into the core's own values
   (``Margins``, ``QueueLimits``, ``PauseRules``, ``Forecaster``); and
   ``scheduling.windows``, which evaluates the policy's windows into the core's
   ``DeviceGates``.  The policy sits *above* the core rather than beside the queue model:
   the core then depends on no schema, and no core type had to move into ``config``.
4. **infrastructure**: the store (``queue.store``, ``engine``, ``drains``, ``tokens``,
   ``migrations``; ``queue.memory`` behind the same ``queue.interface``, without a
   database), the broker (``messaging``) and ``metrics``.  The scheduler loop
   publishes messages and counts metrics, so both sit below it.
5. **scheduler**: ``scheduling.loop``, ``mirror``, ``leader``, ``retention``,
   ``policy_runtime``.
6. **node**: ``workers`` and ``kube``.
7. **SDK and server**: ``Client`` (the ``ebbtide`` package, ``client``, ``client_base``,
   ``handle``, ``workdir``, and ``api.remote``/``api.wire``, the same SDK over HTTP),
   the reports it computes (``report``, ``report_plot``), and the ``ebb server``
   application (the rest of ``api``).
8. **apps**: ``cli``, ``sim``, ``top`` and ``runtime`` (a process's parts, wired).

Imports inside functions count; imports under ``if TYPE_CHECKING:`` count too (they
name types, so they say which way a module depends): an annotation that would point up
names a small ``Protocol`` of the lower layer instead (``metrics.Scheduler``).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import ebbtide

SRC = Path(ebbtide.__file__).resolve().parent
ROOT = SRC.parent

#: The layers, lowest first: each is components, each a list of module prefixes (a
#: module belongs to the component with its longest matching prefix).
LAYERS: list[dict[str, list[str]]] = [
    {
        "base": [
            "ebbtide.errors",
            "ebbtide.units",
            "ebbtide.clock",
            "ebbtide.redaction",
            "ebbtide.scriptfile",
            "ebbtide.identity",
            "ebbtide.args",
            "ebbtide.attempt_logs",
            "ebbtide.shipped",
            "ebbtide.probes",
            "ebbtide.waiting",
            "ebbtide.config.settings",
        ],
    },
    {
        "queue model": [
            "ebbtide.queue",
            "ebbtide.queue.states",
            "ebbtide.queue.spec",
            "ebbtide.queue.models",
            "ebbtide.queue.dependencies",
            "ebbtide.queue.outcomes",
            "ebbtide.queue.rightsizing",
            "ebbtide.queue.purge",
            "ebbtide.queue.qsub",
            "ebbtide.queue.slurm",
        ],
        "job API": [
            "ebbtide.job",
            "ebbtide.status_lines",
            "ebbtide.demo_job",
            "ebbtide.integrations",
        ],
    },
    {
        "scheduling core": [
            "ebbtide.scheduling",
            "ebbtide.scheduling.snapshot",
            "ebbtide.scheduling.capacity",
            "ebbtide.scheduling.fit",
            "ebbtide.scheduling.admission",
            "ebbtide.scheduling.planner",
            "ebbtide.scheduling.forecast",
            "ebbtide.scheduling.cron",
            "ebbtide.preemption",
        ],
    },
    {
        "config": ["ebbtide.config"],
        "windows": ["ebbtide.scheduling.windows"],
    },
    {
        "store": [
            "ebbtide.queue.store",
            "ebbtide.queue.engine",
            "ebbtide.queue.drains",
            "ebbtide.queue.tokens",
            "ebbtide.queue.migrations",
            # the same interface without a database, for tests and the simulator
            "ebbtide.queue.interface",
            "ebbtide.queue.memory",
            # the logic both stores share, over their primitives
            "ebbtide.queue.lifecycle",
        ],
        "messaging": ["ebbtide.messaging"],
        "metrics": ["ebbtide.metrics"],
    },
    {
        "scheduler": [
            "ebbtide.scheduling.loop",
            "ebbtide.scheduling.mirror",
            "ebbtide.scheduling.leader",
            "ebbtide.scheduling.retention",
            "ebbtide.scheduling.policy_runtime",
        ],
    },
    {
        "workers": ["ebbtide.workers"],
        "kube": ["ebbtide.kube"],
    },
    {
        "sdk": [
            "ebbtide",
            "ebbtide.client",
            "ebbtide.client_base",
            "ebbtide.handle",
            "ebbtide.workdir",
            "ebbtide.api",
            "ebbtide.api.remote",
            "ebbtide.api.wire",
        ],
        "report": ["ebbtide.report", "ebbtide.report_plot"],
        "server": [
            "ebbtide.api.app",
            "ebbtide.api.routes",
            "ebbtide.api.serve",
            "ebbtide.api.auth",
            "ebbtide.api.peercred",
        ],
    },
    {
        "cli": ["ebbtide.cli"],
        "sim": ["ebbtide.sim"],
        "top": ["ebbtide.top"],
        "runtime": ["ebbtide.runtime"],
    },
]

#: Imports that point up, waiting for an edit in a module this change left alone
#: ("file:line imported"); each must go once its import is repointed.
WAITING: set[str] = set()

#: Modules of no concern here: none of them may be imported by the package.
_LEAVES = {"ebbtide.__main__"}

_COMPONENT = {
    prefix: (layer, name)
    for layer, components in enumerate(LAYERS)
    for name, prefixes in components.items()
    for prefix in prefixes
}


def component(module: str) -> tuple[int, str]:
    """The (layer, component) a module belongs to: its longest listed prefix's."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        found = _COMPONENT.get(".".join(parts[:n]))
        if found is not None:
            return found
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    importer: str
    imported: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT.parent)}:{self.line}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def _resolve(name: str) -> str:
    """The module of ours ``name`` is, or is in (``ebbtide.x.Name`` → ``ebbtide.x``)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports() -> Iterator[Import]:
    """Every import of one of our modules, anywhere in a module (functions included)."""
    for module, path in MODULES.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                if target == "ebbtide" or target.startswith("ebbtide."):
                    yield Import(path, node.lineno, module, _resolve(target))


ALL = list(imports())


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        if module not in _LEAVES:
            component(module)


def test_imports_point_down() -> None:
    up = []
    waiting_seen = set()
    for imp in ALL:
        (low, low_name), (high, high_name) = component(imp.importer), component(imp.imported)
        if high <= low:
            continue
        key = f"{imp.where} {imp.imported}"
        if key in WAITING:
            waiting_seen.add(key)
            continue
        up.append(
            f"{imp.where}: {imp.importer} (layer {low}, {low_name}) imports "
            f"{imp.imported} (layer {high}, {high_name})"
        )
    assert not up, "imports that point up:\n" + "\n".join(up)
    assert waiting_seen == WAITING, f"repointed, drop from WAITING: {WAITING - waiting_seen}"


def test_components_have_no_cycles() -> None:
    graph: dict[str, set[str]] = defaultdict(set)
    why: dict[tuple[str, str], str] = {}
    for imp in ALL:
        a, b = component(imp.importer)[1], component(imp.imported)[1]
        if a != b:
            graph[a].add(b)
            why.setdefault((a, b), f"{imp.where} imports {imp.imported}")
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        if node in path:
            cycle = [*path[path.index(node) :], node]
            edges = [why[(x, y)] for x, y in pairwise(cycle)]
            raise AssertionError(f"cycle {' → '.join(cycle)}:\n" + "\n".join(edges))
        if node in done:
            return
        for nxt in sorted(graph[node]):
            visit(nxt, [*path, node])
        done.add(node)

    for start in sorted(graph):
        visit(start, [])


#: What the pure core must not bring in: the scheduler's timers, the store, the broker.
BACKENDS = ("apscheduler", "sqlalchemy", "sqlmodel", "redis", "dramatiq")


def backends_loaded(*modules: str) -> list[str]:
    """The backends (of :data:`BACKENDS`) that importing ``modules`` loads, in a fresh
    interpreter."""
    code = (
        "import json, sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & {set(BACKENDS)!r})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return list(json.loads(out.stdout))


def test_pure_core_loads_no_backend() -> None:
    loaded = backends_loaded(
        "ebbtide.preemption.victims", "ebbtide.preemption.relief", "ebbtide.scheduling.planner"
    )
    assert loaded == []


def test_the_simulator_loads_no_store_or_broker() -> None:
    """``ebb sim`` runs the product's pure core and its policy files without SQL, Redis or
    dramatiq (APScheduler reads the windows' cron schedules, as the live scheduler does)."""
    loaded = backends_loaded("ebbtide.sim.cli", "ebbtide.sim.engine", "ebbtide.config.policy")
    assert loaded == ["apscheduler"]


def test_the_package_exports_the_public_api_only() -> None:
    public = sorted(n for n in dir(ebbtide) if not n.startswith("_"))
    assert public == sorted(n for n in ebbtide.__all__ if not n.startswith("_"))
    for name in ebbtide.__all__:
        getattr(ebbtide, name)
