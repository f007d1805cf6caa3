"""``--plot FILE``: where a picture may be drawn, checked before any work is done, and a
failure to write it said in one line (``ebb report``, ``ebb sim``).

A trial's traps: ``--plot ""`` wrote a hidden ``.png``, ``--plot week.txt`` got
matplotlib's words, and ``ebb sim --plot /nonexistent/dir/sim.png`` ran the whole
simulation, then threw it away with a traceback.
"""

from __future__ import annotations

from pathlib import Path

from ebbtide.errors import UserError


def check_plot_path(path: str) -> None:
    """Refuse ``path`` (:class:`UserError`, naming ``--plot``) unless a picture can be drawn
    there: a file name, in a directory that exists, with a suffix matplotlib draws (none:
    PNG).  Call the command's ``pyplot()`` first, which says how to install matplotlib."""
    if not path.strip() or Path(path).name.startswith("."):
        raise UserError(f"--plot {path!r}: give a file name, like week.png")
    folder = Path(path).expanduser().absolute().parent
    if not folder.is_dir():
        raise UserError(f"--plot {path}: no directory {folder}")
    from matplotlib.backend_bases import FigureCanvasBase

    kind = Path(path).suffix.lower().lstrip(".")
    known = FigureCanvasBase.get_supported_filetypes()
    if kind and kind not in known:
        raise UserError(
            f"--plot {path}: cannot draw a .{kind} file; end the name in one of "
            f".{', .'.join(sorted(known))} (.png without one)"
        )


def plot_failed(path: str, exc: OSError) -> UserError:
    """What to raise when writing the picture to ``path`` failed (the directory went away,
    no permission, a full disk): one line naming ``--plot``, no traceback."""
    return UserError(f"--plot {path}: {exc.strerror or exc}")
