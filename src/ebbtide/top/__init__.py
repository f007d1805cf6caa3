"""``ebb top``: a live terminal view of the fleet.

Data and drawing are apart: :mod:`~ebbtide.top.snapshot` reads the fleet once per refresh
into a :class:`~ebbtide.top.snapshot.FleetSnapshot`; :mod:`~ebbtide.top.view` holds what
the person chose to see (sort, filters, scroll, panel) and what each key does to it;
:mod:`~ebbtide.top.render` draws one frame of a snapshot in a view, pure and only the rows
that fit; :mod:`~ebbtide.top.live` is the terminal loop (keys in, frames out).
"""
