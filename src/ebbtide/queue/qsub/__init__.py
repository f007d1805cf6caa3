"""qsub-style option parsing: ``-l``, ``-J``, ``-W depend=``, ``-v`` and script directives.

Pure functions, no I/O except :func:`load_script` reading the script file; shared by
``ebb qsub`` and the server's ``POST /qsub``.  The click command (or the request)
collects the raw option strings into a :class:`QsubOptions`, reads the script's
``#PBS`` / ``#EBB`` directive lines into another, and :func:`build_spec_kwargs` merges the
two (the command line wins) into keyword arguments for
:class:`~ebbtide.queue.spec.JobSpec`.

Every error is a :class:`~ebbtide.errors.SpecError` whose message says where the bad
value came from: the flag (``-l gpumem: ...``) or the file and line
(``train.sh line 3: -J: ...``).  Numbers past their bounds are errors that name the
bound; a script must be a regular file of at most
:data:`~ebbtide.scriptfile.MAX_SCRIPT_BYTES`.

The parts: :mod:`~ebbtide.queue.qsub.options` (the raw options and the directive
options' table), :mod:`~ebbtide.queue.qsub.resources` (the ``-l`` grammar),
:mod:`~ebbtide.queue.qsub.values` (``-J``, ``-W depend=``, ``-v``, ``-V``),
:mod:`~ebbtide.queue.qsub.directives` (a script's directive lines) and
:mod:`~ebbtide.queue.qsub.build` (options to a ``JobSpec``).
"""

from __future__ import annotations

from ebbtide.queue.qsub.build import (
    JOB_KINDS,
    QSUB_FLAG_OPTIONS,
    QSUB_LIST_OPTIONS,
    QSUB_TEXT_OPTIONS,
    build_spec_kwargs,
    qsub_command_line,
    qsub_spec,
    script_spec,
)
from ebbtide.queue.qsub.directives import (
    DIRECTIVE_PREFIXES,
    directive_lines,
    load_script,
    parse_directive_tokens,
    parse_directives,
    parse_script_directives,
)
from ebbtide.queue.qsub.options import PBS_IGNORED, PBS_IGNORED_ATTRIBUTES, QsubOptions
from ebbtide.queue.qsub.resources import KNOWN_RESOURCES, PBS_IGNORED_RESOURCES, parse_resources
from ebbtide.queue.qsub.values import (
    DEPEND_FORMS,
    DEPENDENCY_KINDS,
    export_env,
    parse_array,
    parse_depend,
    parse_env,
)

__all__ = [
    "DEPENDENCY_KINDS",
    "DEPEND_FORMS",
    "DIRECTIVE_PREFIXES",
    "JOB_KINDS",
    "KNOWN_RESOURCES",
    "PBS_IGNORED",
    "PBS_IGNORED_ATTRIBUTES",
    "PBS_IGNORED_RESOURCES",
    "QSUB_FLAG_OPTIONS",
    "QSUB_LIST_OPTIONS",
    "QSUB_TEXT_OPTIONS",
    "QsubOptions",
    "build_spec_kwargs",
    "directive_lines",
    "export_env",
    "load_script",
    "parse_array",
    "parse_depend",
    "parse_directive_tokens",
    "parse_directives",
    "parse_env",
    "parse_resources",
    "parse_script_directives",
    "qsub_command_line",
    "qsub_spec",
    "script_spec",
]
