"""Eviction: who goes (pure victim selection), how (enforcement), and what comes after."""
