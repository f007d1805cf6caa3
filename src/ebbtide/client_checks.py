"""What a submission is checked against beyond the spec's own rules, and what its
submitter is told: the policy in effect (the one the scheduler published) and
the Kubernetes resource profile (whether the fleet's nodes could hold it is
:mod:`ebbtide.client_fleet`).  :class:`~ebbtide.client.Client` and ``ebb server`` use them.
"""

from __future__ import annotations

import logging
import signal
from pathlib import Path
from typing import Any

from ebbtide.client_paths import shared_checkpoint_note, shared_output_notes
from ebbtide.config.policy import Policy, load_policy, parse_published
from ebbtide.errors import ConfigError, SpecError
from ebbtide.kube.profiles import Grant, grant_for
from ebbtide.queue.qsub.directives import unread_directives_note
from ebbtide.queue.spec import JobSpec
from ebbtide.queue.store import Store
from ebbtide.units import signal_name

log = logging.getLogger("ebbtide.client")


def kubernetes_grant(spec: JobSpec, policy: Policy) -> Grant | None:
    """Under a ``kubernetes:`` section, what the fleet's resource profile grants for the
    spec's slice (None without one).  Refuses, naming the field, a slice the profile
    cannot express, a warning signal other than SIGTERM, and a job with no image."""
    settings = policy.kubernetes
    if settings is None:
        return None
    if spec.signal != int(signal.SIGTERM):
        raise SpecError(
            "signal",
            f"the kubelet warns a pod with SIGTERM only, so a job cannot ask for "
            f"{signal_name(spec.signal)} under the Kubernetes executor; leave the signal "
            "unset (TERM)",
        )
    if policy.image_for(spec.queue, spec.image) is None:
        raise SpecError(
            "image",
            f"the job names no image, and neither queue {spec.queue!r} nor the policy's "
            "kubernetes section has a default; give one (ebb qsub --image IMAGE, "
            "JobSpec(image=...))",
        )
    return grant_for(spec, settings)


#: The published policy last parsed, by its text: a server parses it once, not per request.
_parsed: dict[str, Policy] = {}


def new_store_file(settings: Any) -> Path | None:
    """The SQLite file opening ``settings``' store would make (None: it is there, or the
    store is not a SQLite file)."""
    from ebbtide.config.settings import sqlite_file

    path = sqlite_file(settings.db_url)
    return path if path is not None and not path.exists() else None


def say_new_store(path: Path) -> None:
    """A trial's trap: ``Client()`` under a mistyped ``EBBTIDE_HOME`` made an empty store
    in silence, and ``get(5)`` said only that there is no job 5."""
    log.warning(
        "there was no ebbtide store at %s: made a new, empty one (check EBBTIDE_HOME or "
        "EBBTIDE_DB_URL if jobs were expected there)",
        path,
    )


def submit_notes(spec: JobSpec, policy: Policy) -> list[str]:
    """What to tell whoever submits ``spec`` about how it is taken here: a queue it names
    by an alias (:func:`queue_notes`), what attempts running as pods do not do
    (:func:`pod_notes`), a checkpoint directory or an output file an array's tasks would
    share, directive lines of a script's text that nothing read."""
    return [
        *queue_notes(spec, policy),
        *pod_notes(spec, policy),
        *shared_checkpoint_note(spec),
        *shared_output_notes(spec),
        *unread_directives_note(spec.script, spec.script_path),
    ]


def queue_notes(spec: JobSpec, policy: Policy) -> list[str]:
    """A note when the spec names its queue by an alias (a Slurm partition, a PBS queue
    of another site's): the job is recorded under the queue's own name; and when no
    window of the policy admits its queue (the job waits until the policy changes)."""
    try:
        named = policy.queue_named(spec.queue)
    except ConfigError:
        return []
    notes = []
    if named != spec.queue:
        what = "partition" if spec.compat == "slurm" else "queue"
        notes.append(f"{what} {spec.queue!r} is queue {named!r} here")
    if named in policy.unwindowed_queues():
        notes.append(
            f"queue {named!r} is admitted by no window of the policy: its jobs never run until "
            "one admits it (ebb policy explain)"
        )
    return notes


def pod_notes(spec: JobSpec, policy: Policy) -> list[str]:
    """What a spec asks that attempts running as pods do not do (the policy has a
    ``kubernetes:`` section): said at submission, never dropped silently."""
    if policy.kubernetes is None:
        return []
    notes = []
    for name, option in (("stdout", "-o/--output"), ("stderr", "-e/--error")):
        if getattr(spec, name):
            notes.append(
                f"{option}: where attempts run as pods, their output is the pod's log, kept "
                "as the attempt's log (`ebb logs ID`), not this file"
            )
    if spec.signal_shell_only:
        notes.append(
            "--signal=B:: where attempts run as pods, the warning is the kubelet's SIGTERM "
            "to the container's first process, the script's shell or not"
        )
    return notes


def check_policy_first(settings: Any) -> None:
    """Where the SQLite store is not made yet, the policy file (``EBBTIDE_POLICY``) that
    will be in effect there is read first: a bad one is refused before anything is
    made (a trial's trap: the job was refused, and an empty store was left behind)."""
    from ebbtide.config.settings import sqlite_file

    file = sqlite_file(settings.db_url)
    if settings.policy_path is not None and file is not None and not file.exists():
        load_policy(settings.policy_path)


def check_deadline(spec: JobSpec, policy: Policy) -> None:
    """A deadline no longer than the spec's queue allows (``max_deadline_s``)."""
    queue = policy.queues.get(spec.queue)
    limit = None if queue is None else queue.max_deadline_s
    if limit is not None and (spec.deadline_s or 0) > limit:
        raise SpecError(
            "deadline",
            f"{spec.deadline_s:g}s is longer than queue {spec.queue!r} allows "
            f"(max_deadline_s {limit:g}s)",
        )


def policy_in_effect(store: Store, path: Path | None) -> Policy:
    """The policy jobs are checked against: the one the running (or last) scheduler
    published to the store (:func:`published_policy`), so every client sees the queues,
    defaults and deadlines the scheduler applies; the file at ``path``
    (``EBBTIDE_POLICY``) only while none is published."""
    return published_policy(store) or load_policy(path)


def published_policy(store: Store) -> Policy | None:
    """The policy the scheduler published, parsed once per text; None when none is, or
    when this ebbtide cannot read it (a newer scheduler's: a warning says so)."""
    published = store.published_policy()
    if published is None:
        return None
    text, source, _ = published
    policy = _parsed.get(text)
    if policy is None:  # (threads of a server may both parse it: no harm)
        try:
            policy = parse_published(text, source)
        except ConfigError as exc:
            log.warning("the scheduler's published policy cannot be read here: %s", exc)
            return None
        _parsed.clear()
        _parsed[text] = policy
    return policy
