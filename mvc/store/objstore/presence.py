"""Which of some objects a remote holds, asking only about them: what makes a push cost
O(what it sends), not O(the remote).

A push must not send again what a killed push already uploaded, and a listing of every
object (loose keys and every pack index) grows with the history.  So each push that uploads
is an *upload* with an id:

1. `begin_upload` writes the marker ``pushes/<id>`` before the first object goes up;
2. the push's packs go to ``packs/<id>/`` (`RemoteBlobStore.put_many(upload=id)`; readers
   list ``packs/`` whole and see them as any other pack);
3. `end_upload` deletes the marker once the refs moved: a ref then reaches what it wrote,
   and a later push's walk stops there.

`present` answers for the objects a push's walk reached: the pack indexes under
``packs/<id>/`` of every upload whose marker is still there (killed pushes, pushes in
flight) -- one listing of ``pushes/`` and one of each such folder -- and one HEAD per loose
candidate, `RemoteBlobStore.workers` at a time.  A candidate smaller than a packed object
is asked about only while some marker is there: the objects a finished push stored are
reached from a ref, so only an unfinished one can have left a small object loose; at worst
a small object the remote holds by other means (an old commit's chunk come back) is sent
again, inside a pack.  Markers are an optimisation only: a lost one costs re-sent small
objects, never a wrong remote.
"""
from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from mvc.store.objstore import blobs as _blobs
from mvc.store.objstore.blobs import RemoteBlobStore, loose_key
from mvc.store.objstore.storage import ObjectStorage

#: Where the markers of unfinished uploads live.
UPLOADS = "pushes/"
#: What `begin_upload` names an upload (anything else under ``pushes/`` is not a marker: the
#: name becomes part of a listed path).
_UPLOAD_ID = re.compile(r"[0-9a-f]{11}-[0-9a-f]{12}")


@dataclass
class Presence:
    """What `present` found: the ids held, and per unfinished upload the ids its packs hold."""

    found: set[str] = field(default_factory=set)
    uploads: dict[str, set[str]] = field(default_factory=dict)


def begin_upload(storage: ObjectStorage) -> str:
    """A new upload id, its marker written (before any of its objects)."""
    uid = f"{int(time.time()):011x}-{os.urandom(6).hex()}"
    storage.put(UPLOADS + uid, json.dumps({"started": time.time()}).encode())
    return uid


def end_upload(storage: ObjectStorage, uid: str) -> None:
    """Drop the marker of upload `uid` (its objects are reached from a ref now)."""
    storage.delete(UPLOADS + uid)


def unfinished_uploads(storage: ObjectStorage) -> list[str]:
    """The ids of uploads whose marker is there."""
    names = (k[len(UPLOADS):] for k, _ in storage.list(UPLOADS))
    return [n for n in names if _UPLOAD_ID.fullmatch(n)]


def present(blobs: RemoteBlobStore, sizes: Mapping[str, int]) -> Presence:
    """Which of the objects `sizes` names (id -> size) `blobs` holds, asking only about them
    and the unfinished uploads (module doc)."""
    out = Presence()
    uploads = unfinished_uploads(blobs.storage)
    for uid in uploads:
        out.uploads[uid] = blobs.pack_ids(uid + "/")
    # Packs this store loaded before (a long-lived store) answer without a request.
    out.found = blobs.loaded_ids(sizes)
    ask = [o for o, n in sizes.items()
           if o not in out.found and (uploads or n >= _blobs.PACK_MAX_OBJECT)]
    with ThreadPoolExecutor(max(1, blobs.workers)) as pool:
        heads = list(pool.map(lambda o: blobs.storage.head(loose_key(o)), ask))
    out.found.update(o for o, n in zip(ask, heads) if n is not None)
    return out


def forgettable(presence: Presence, reached: Collection[str]) -> list[str]:
    """The unfinished uploads whose packs hold only objects in `reached`: once a ref reaches
    those, their markers only cost later pushes a listing."""
    done = set(reached)
    return [uid for uid, ids in presence.uploads.items() if ids and ids <= done]
