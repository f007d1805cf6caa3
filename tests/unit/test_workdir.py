"""Jobs run where they were submitted: ``cwd`` and ``checkpoint_dir`` against the workdir."""

from __future__ import annotations

from pathlib import Path

import pytest

from ebbtide.errors import SpecError, UserError
from ebbtide.queue.spec import JobSpec
from ebbtide.workdir import with_workdir


def test_a_spec_without_cwd_runs_in_the_workdir() -> None:
    spec = with_workdir(JobSpec(command=["x"], priority=3), "/home/a/proj")
    assert spec.cwd == "/home/a/proj"
    assert spec.model_fields_set >= {"priority", "cwd"}  # what was set stays set
    assert "deadline_s" not in spec.model_fields_set  # and what was not, unset


def test_relative_paths_resolve_against_the_workdir() -> None:
    spec = with_workdir(JobSpec(command=["x"], cwd="a/../b", checkpoint_dir="ck"), "/w")
    assert (spec.cwd, spec.checkpoint_dir) == ("/w/b", "/w/ck")


def test_absolute_and_home_paths_are_left_alone() -> None:
    spec = JobSpec(command=["x"], cwd="/abs", checkpoint_dir="~/ck")
    assert with_workdir(spec, "/w") is spec


def test_the_current_directory_is_the_default_workdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert with_workdir(JobSpec(command=["x"], cwd="out"), ".").cwd == str(tmp_path / "out")


def test_without_a_workdir_relative_paths_are_refused() -> None:
    with pytest.raises(SpecError) as info:
        with_workdir(JobSpec(command=["x"], checkpoint_dir="ck"), None)
    assert info.value.field == "checkpoint_dir"
    assert with_workdir(JobSpec(command=["x"]), None).cwd is None


def test_no_default_cwd_when_asked_not_to() -> None:
    """Under Kubernetes a job without cwd runs in its image's working directory."""
    assert with_workdir(JobSpec(command=["x"]), "/w", default_cwd=False).cwd is None
    assert with_workdir(JobSpec(command=["x"], cwd="a"), "/w", default_cwd=False).cwd == "/w/a"


def test_a_removed_current_directory_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(UserError, match="current directory no longer exists"):
        with_workdir(JobSpec(command=["x"]), ".")


def test_a_resolved_path_too_long_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="cwd"):
        with_workdir(JobSpec(command=["x"], cwd="d"), "/" + "x" * 5000)
