"""``ebb server``: the SDK as an HTTP API (TCP and a Unix socket), and its client.

- :mod:`~ebbtide.api.app`: the FastAPI application (``create_app``);
  :mod:`~ebbtide.api.routes` its paths, :mod:`~ebbtide.api.auth` who a request is from;
- :mod:`~ebbtide.api.peercred`: Unix-socket callers as the kernel knows them;
- :mod:`~ebbtide.api.serve`: binding and serving;
- :mod:`~ebbtide.api.remote`: :class:`RemoteClient`, what ``Client()`` is with
  ``EBBTIDE_URL`` set; :mod:`~ebbtide.api.wire` what both sides share.

Only the server side imports the web framework.
"""
