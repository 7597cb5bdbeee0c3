"""A run's workdir: who owns it (workdir.py) and what a rerun continues from (rerun.py)."""
