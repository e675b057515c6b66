"""Child process of tests/repo/test_commit_pipeline.py: the write stage of a commit plan, on its own.

    python pipeline_worker.py JOB OUT

JOB is a pickle of (repository path, plan, names); OUT receives the pickled records.  Like a
rank of a sharded save it opens the store itself and writes only the tensors it was handed.
"""
from __future__ import annotations

import pickle
import sys


def main(job: str, out: str) -> None:
    from mvc.repo import pipeline
    from mvc.repo.repository import Repo

    with open(job, "rb") as fh:
        path, plan, names = pickle.load(fh)
    with Repo(path) as repo:
        records = pipeline.write(plan, names, blobs=repo.store.blobs,
                                 read_quantized=repo.reader.read_quantized)
    with open(out, "wb") as fh:
        pickle.dump(records, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
