"""One reconcile pass as a straight run of named phases, and ``status``."""
