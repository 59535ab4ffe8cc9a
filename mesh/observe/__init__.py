"""Seeing inside a running mesh: profiles, flame graphs, baselines and the status page."""
