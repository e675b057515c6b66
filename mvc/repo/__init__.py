"""Porcelain: commits, checkout, refs and revisions, history, gc and fsck."""
