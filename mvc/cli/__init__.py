"""The `mvc` command-line interface."""
