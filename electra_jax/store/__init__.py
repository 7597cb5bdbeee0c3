"""Where a run's files live: the path layer, JSON files, checkpoints and the gs:// lock."""
