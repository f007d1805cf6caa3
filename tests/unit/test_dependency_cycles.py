"""``qalter -W depend=`` must not make jobs wait for each other in a ring (none of them
could ever run): :func:`cycle_through` finds the ring, checked against a plain
reachability search on random dependency graphs."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from ebbtide.queue.dependencies import cycle_through


def dep(job_id: int, *, array: bool = False, kind: str = "afterok") -> dict[str, Any]:
    return {"kind": kind, "job_id": job_id, **({"array": True} if array else {})}


def test_a_job_that_names_itself_is_a_cycle_of_one() -> None:
    assert cycle_through(5, None, [dep(5)], []) == [5]


def test_a_ring_through_other_jobs_is_named_in_order() -> None:
    dependents = [(7, None, [dep(9)]), (9, None, [dep(5)]), (3, None, [dep(1)])]
    assert cycle_through(5, None, [dep(3), dep(7)], dependents) == [7, 9, 5]
    assert cycle_through(5, None, [dep(3)], dependents) is None


def test_the_jobs_own_dependencies_are_those_being_replaced() -> None:
    # job 5 waits for 7 today; 7 waits for nothing: 7 may wait for 5 once 5 no longer waits
    dependents = [(5, None, [dep(7)]), (7, None, [dep(5)])]
    assert cycle_through(5, None, [dep(8)], dependents) is None
    assert cycle_through(7, None, [dep(5)], [(5, None, [dep(8)])]) is None


def test_an_array_waits_for_each_of_its_tasks() -> None:
    # array 20's task 22 waits for job 5
    dependents = [(21, 20, [dep(1)]), (22, 20, [dep(5)])]
    assert cycle_through(5, None, [dep(20, array=True)], dependents) == [22, 5]
    assert cycle_through(5, None, [dep(20)], dependents) is None  # task 20 alone waits for nothing
    # a task that waits for its own array waits for itself
    assert cycle_through(22, 20, [dep(20, array=True)], []) == [22]
    # and a task may wait for another task of its array that does not wait for it
    assert cycle_through(22, 20, [dep(21)], dependents) is None


def _reaches(job_id: int, array_id: int | None, depends: list[Any], graph: dict[int, Any]) -> bool:
    """Whether job ``job_id`` is reachable from ``depends`` (plain search, no paths)."""
    members: dict[int, set[int]] = {}
    for other, (its_array, _) in graph.items():
        if its_array is not None:
            members.setdefault(its_array, set()).add(other)
    if array_id is not None:
        members.setdefault(array_id, set()).add(job_id)
    todo, seen = list(depends), set()
    while todo:
        d = todo.pop()
        waits = members.get(d["job_id"], set()) if d.get("array") else {d["job_id"]}
        for other in waits:
            if other == job_id:
                return True
            if other not in seen:
                seen.add(other)
                if other in graph:
                    todo.extend(graph[other][1])
    return False


@st.composite
def graphs(draw: Any) -> tuple[int, int | None, list[Any], dict[int, Any]]:
    ids = list(range(1, draw(st.integers(2, 12)) + 1))
    arrays = draw(st.lists(st.sampled_from(ids), max_size=3, unique=True))

    def deps() -> list[Any]:
        picked = draw(st.lists(st.sampled_from(ids), max_size=3))
        return [dep(i, array=i in arrays and draw(st.booleans())) for i in picked]

    graph = {
        i: (draw(st.sampled_from([None, *arrays])) if arrays else None, deps())
        for i in ids
        if draw(st.booleans())
    }
    job_id = draw(st.sampled_from(ids))
    own_array = graph.get(job_id, (None, []))[0]
    graph.pop(job_id, None)
    return job_id, own_array, deps(), graph


@settings(max_examples=400, deadline=None)
@given(graphs())
def test_a_cycle_is_found_exactly_when_the_job_reaches_itself(case: Any) -> None:
    job_id, own_array, depends, graph = case
    dependents = [(i, a, d) for i, (a, d) in graph.items() if d]
    found = cycle_through(job_id, own_array, depends, dependents)
    assert (found is not None) == _reaches(job_id, own_array, depends, graph)
    if found is not None:  # a path of waits that ends at the job
        assert found[-1] == job_id
        for waiter, waited in itertools.pairwise(found):
            _, its = graph[waiter]
            assert any(
                d["job_id"] == waited
                or (d.get("array") and graph.get(waited, (None,))[0] == d["job_id"])
                or (d.get("array") and waited == job_id and own_array == d["job_id"])
                for d in its
            ), (waiter, waited)
