"""Which devices take whose jobs, in one planner pass.  Pure: no clock reads, no I/O.

Each node's heartbeat says whose jobs its agent runs (``DeviceView.runs_jobs_of``, read by
:mod:`ebbtide.queue.whose_jobs`); the planner puts a job only on a device of a node that
would run it for its owner; a job that no node up runs for its owner waits with
:data:`NOT_RUN_ANYWHERE`, and one that only other nodes have room for with
:data:`NOT_RUN_WITH_ROOM`.  A node that does not say (an older agent) runs anyone's.  In
most fleets every node runs anyone's: then :attr:`Owners.anyone` holds and the planner
looks at nothing here per job.

Owners are told apart only where a node singles them out (root, where a node runs every
user's jobs but root's; NAME, where one runs NAME's only): every other owner's jobs go to
the same nodes, so they share one :class:`Allowed`, whose fit index is built at the first
job that needs it and kept in step with the pass's own, and one reason
(:class:`OwnersWait`, which names each job's owner only when it is written).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ebbtide.queue.whose_jobs import RUNS_ANYONES, in_words, refuses, singled_out
from ebbtide.scheduling.fit import FitIndex, Free, WholeFit
from ebbtide.scheduling.snapshot import DeviceView

#: Why a job waits that only nodes which would refuse its owner have room for; ``nodes``
#: names the first few of them, each with whose jobs it runs.
NOT_RUN_WITH_ROOM = "waiting: no node with room runs {owner}'s jobs ({nodes})"
#: Why a job waits that no node up would run for its owner (``nodes``: as above).
NOT_RUN_ANYWHERE = "waiting: no node runs {owner}'s jobs ({nodes})"
#: At most this many nodes are named in one of these reasons.
NAMED_NODES = 3


@dataclass(frozen=True)
class OwnersWait:
    """Why the jobs of one class of owners (and one shape) wait, whoever their owner:
    :data:`NOT_RUN_WITH_ROOM` or :data:`NOT_RUN_ANYWHERE` with the nodes named, and the
    owner's name put in by :meth:`text` for each job whose reason is written."""

    template: str
    nodes: str

    def text(self, owner: str) -> str:
        return self.template.format(owner=owner, nodes=self.nodes)


class Allowed:
    """The devices that take the jobs of one class of owners, as the pass goes."""

    def __init__(
        self,
        refused: dict[str, str],
        frees: Sequence[Free],
        by_node: dict[str, list[Free]],
        index: FitIndex,
    ) -> None:
        #: node → whose jobs it runs, for the nodes that refuse these owners' jobs
        self.refused = refused
        #: the devices that take them, in snapshot order, and by node
        self.frees = [f for f in frees if f.device.node not in refused]
        self.by_node = {n: fs for n, fs in by_node.items() if n not in refused}
        self._main = index
        self._index: FitIndex | None = None
        self._wholes: WholeFit | None = None
        #: how many of the pass's refiles this index has taken in
        self._seen = 0

    def takes(self, f: Free) -> bool:
        return f.device.node not in self.refused

    def index(self) -> FitIndex:
        """A fit index of these devices, in step with the pass's own (``index``): every
        device the pass changed since the last call, refiled."""
        main, refused = self._main, self.refused
        if self._index is None:
            self._index = FitIndex(self.frees)
        else:
            for f in main.refiled[self._seen :]:
                if f.device.node not in refused:
                    self._index.refile(f)
        self._seen = len(main.refiled)
        return self._index

    def wholes(self) -> WholeFit:
        """Whole-GPU fits among these devices (the index brought in step first)."""
        index = self.index()
        if self._wholes is None:
            self._wholes = WholeFit(self.by_node, index)
        return self._wholes


class Owners:
    """Whose jobs the nodes of one pass run: :meth:`allowed` says where an owner's go."""

    def __init__(self, devices: Iterable[DeviceView]) -> None:
        said = {d.node: r for d in devices if (r := d.runs_jobs_of) and r != RUNS_ANYONES}
        #: node → whose jobs it runs, for the nodes that single someone out
        self.refusing = {node: r for node, r in said.items() if singled_out(r) is not None}
        #: the owners some node treats unlike the others
        self.singled_out = frozenset(
            o for r in self.refusing.values() if (o := singled_out(r)) is not None
        )
        #: every node runs anyone's jobs: nothing to look at per job
        self.anyone = not self.refusing
        self._frees: Sequence[Free] = ()
        self._by_node: dict[str, list[Free]] = {}
        self._index: FitIndex | None = None
        #: per class of owners (an owner singled out, or "" for all the others)
        self._allowed: dict[str, Allowed | None] = {}

    def bind(self, frees: Sequence[Free], by_node: dict[str, list[Free]], index: FitIndex) -> None:
        """The pass's devices (in snapshot order, and by node) and its fit index."""
        self._frees, self._by_node, self._index = frees, by_node, index

    def class_of(self, owner: str) -> str:
        """``owner``'s class: the owner where a node singles it out, else "" (every other
        owner's jobs go to the same nodes)."""
        return owner if owner in self.singled_out else ""

    def allowed(self, owner: str) -> Allowed | None:
        """The devices that take ``owner``'s jobs; None where every device does."""
        key = self.class_of(owner)
        if key in self._allowed:
            return self._allowed[key]
        refused = {n: r for n, r in self.refusing.items() if refuses(r, owner) is not None}
        allowed = None
        if refused:
            assert self._index is not None, "bind() first"
            allowed = Allowed(refused, self._frees, self._by_node, self._index)
        self._allowed[key] = allowed
        return allowed

    def reason(self, allowed: Allowed, room: Callable[[list[Free]], bool]) -> OwnersWait | None:
        """Why a job of the owners ``allowed`` serves, placed nowhere among its devices,
        waits for its owner's sake: no node up runs its owner's jobs (room or not: room
        would not help), or some node that refuses its owner has ``room`` for it; None
        when neither (it waits as any job would, for the devices that take its jobs)."""
        if not allowed.frees:
            return OwnersWait(NOT_RUN_ANYWHERE, _named(allowed.refused, allowed))
        roomy = [n for n in allowed.refused if room(self._by_node.get(n, []))]
        if roomy:
            return OwnersWait(NOT_RUN_WITH_ROOM, _named(roomy, allowed))
        return None


def _named(nodes: Iterable[str], allowed: Allowed) -> str:
    """``gpu-a: bob's only; gpu-b: every user's but root's (+2 more)``."""
    nodes = list(nodes)
    shown = "; ".join(f"{n}: {in_words(allowed.refused[n])}" for n in nodes[:NAMED_NODES])
    more = len(nodes) - NAMED_NODES
    return shown + (f" (+{more} more)" if more > 0 else "")
