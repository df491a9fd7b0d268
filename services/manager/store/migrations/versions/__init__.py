"""One module per revision, oldest first: ``v<rev>_<slug>.py``."""
