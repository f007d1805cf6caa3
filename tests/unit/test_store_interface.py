"""The store's interface: both stores satisfy :class:`JobStore`, which lists every public
method of the SQL store with its signature (a new store method cannot be forgotten), and
the in-memory store does not import SQL itself.  mypy checks the same statically
(``ebbtide.queue.interface``)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import ebbtide.queue.memory
from ebbtide.clock import FakeClock
from ebbtide.queue.interface import JobStore
from ebbtide.queue.memory import MemoryStore
from ebbtide.queue.store import Store

#: the SQL store's public attributes that are its own, not the interface's
SQL_ONLY = {"url", "engine", "drains", "tokens"}


def _public_methods(cls: type) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n))}


def _protocol_methods() -> set[str]:
    return {
        n for n in JobStore.__dict__ if not n.startswith("_") and callable(JobStore.__dict__[n])
    }


def test_the_protocol_lists_every_public_method_of_the_store() -> None:
    assert _protocol_methods() == _public_methods(Store)
    assert _protocol_methods() <= _public_methods(MemoryStore)


@pytest.mark.parametrize("name", sorted(_public_methods(Store)))
@pytest.mark.parametrize("cls", [Store, MemoryStore])
def test_each_method_has_the_protocols_signature(name: str, cls: type) -> None:
    want = inspect.signature(getattr(JobStore, name))
    got = inspect.signature(getattr(cls, name))
    assert list(got.parameters) == list(want.parameters)
    for param, expected in zip(got.parameters.values(), want.parameters.values(), strict=True):
        assert (param.kind, param.annotation) == (expected.kind, expected.annotation), param
        if expected.default is Ellipsis:  # a default the protocol does not spell out
            assert param.default is not inspect.Parameter.empty, param
        else:
            assert param.default == expected.default, param
    assert got.return_annotation == want.return_annotation


def test_both_stores_are_job_stores(sqlite_url: str) -> None:
    store = Store(sqlite_url, clock=FakeClock())
    try:
        assert isinstance(store, JobStore)
        assert isinstance(store.fenced(1), JobStore)
        attributes = {n for n in vars(store) if not n.startswith("_")}
        assert attributes - SQL_ONLY == set(JobStore.__annotations__) == {"clock"}
    finally:
        store.close()
    assert isinstance(MemoryStore(), JobStore)
    assert isinstance(MemoryStore().fenced(1), JobStore)


def test_the_memory_store_does_not_import_sql_itself() -> None:
    package = Path(ebbtide.queue.memory.__file__).parent
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                assert name.split(".")[0] not in {"sqlalchemy", "sqlmodel"}, (path.name, name)
