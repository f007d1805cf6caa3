"""The data files ebbtide ships (``ebbtide/data``: the trace samples, with their
attribution), found by name wherever ebbtide is installed."""

from __future__ import annotations

from importlib import resources
from pathlib import Path


def shipped_or_path(path_text: str) -> Path:
    """The file ``path_text`` names, else, for a bare name that is not a file here, the
    shipped file of that name (``genai_sample.csv``, ``azure_code_llm_load.csv``)."""
    path = Path(path_text).expanduser()
    if path.exists() or path.name != path_text:
        return path
    shipped = resources.files("ebbtide").joinpath("data", path_text)
    return Path(str(shipped)) if shipped.is_file() else path
