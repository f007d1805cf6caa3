"""The node agent, its executors and its headroom sources."""
