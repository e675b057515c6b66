"""Remotes: push, fetch, pull and clone over object storage (``s3://``, ``file://``).

`mvc.remote.config` keeps the remotes a repository knows (``.mvc/remotes.json``);
`mvc.remote.transfer` moves objects and refs between a repository's store and a
remote (`mvc.store.objstore`), with the one reachability walker of `mvc.repo.objectdb`
deciding what the other side lacks.  docs/remotes.md describes the layout and the
consistency rules.
"""
