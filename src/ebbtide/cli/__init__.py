"""The qsub-style command line (``ebb`` / ``ebbtide``)."""
