"""The scheduler: a pure planner over a snapshot, and the thin loop that applies it."""
