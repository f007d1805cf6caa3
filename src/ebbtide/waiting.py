"""What a submitter and ``qstat`` say of a job that waits for something not there: no
node agent, or no scheduler.  Text alone, so that the thin client's ``qstat`` (which loads
no database or validation library) says it too."""

from __future__ import annotations

#: What a submission to a store no node agent ever reported to is told.
NO_AGENT_NOTE = (
    "no node agent has ever reported to this store: the job waits until one does (ebb up, "
    "ebb worker; is EBBTIDE_HOME or EBBTIDE_DB_URL mistyped?)"
)
#: What ``qstat`` says when it lists a job waiting while no scheduler holds the store's
#: leader lock, and a submission to a store node agents report to is told then.
NO_SCHEDULER_NOTE = (
    "no scheduler is running on this store: queued jobs wait until one does (ebb up, or "
    "ebb scheduler)"
)
