"""The trace-driven simulator behind ``ebb sim``.

It runs the product's own planner, victim policy and headroom forecast on a virtual
clock over recorded online load (:mod:`~ebbtide.sim.online`) and a stream of offline jobs
(:mod:`~ebbtide.sim.jobs`), for ebbtide and the baselines side by side
(:mod:`~ebbtide.sim.policies`), and reports what each harvested and what it cost the
online side (:mod:`~ebbtide.sim.metrics`).

Modules: ``online`` and ``jobs`` (inputs), ``policies``, ``timing`` (periods and
calibrated latencies), ``state`` (devices, jobs, attempts), ``eviction``, ``backlog`` (the
queue), ``planning`` (what a planner pass sees), ``engine`` (the event loop), ``metrics``,
``runner`` (every policy on one workload), ``report``, ``record`` and ``plot``, ``cli``.
"""
