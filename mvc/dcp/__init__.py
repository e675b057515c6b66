"""`torch.distributed.checkpoint` storage for mvc: one `dcp.save` is one commit.

    import torch.distributed.checkpoint as dcp
    from mvc.dcp import MvcStorageReader, MvcStorageWriter

    dcp.save(state, storage_writer=MvcStorageWriter("runs/exp1", message="step 1000"))
    dcp.load(state, storage_reader=MvcStorageReader("runs/exp1", rev="HEAD"))

Every rank encodes and stores its own tensors and shards; the coordinator publishes the
commit (`mvc.dcp.writer`); `save(state, writer)` is `dcp.save` that also says whether the commit
landed when the save failed (`DcpPublishedError`); `async_save(state, writer)` is
`dcp.async_save` whose future gives the commit id or raises the typed mvc error
(`mvc.dcp.asyncsave`).  A load reads the regions each rank asks for, at any world size
(`mvc.dcp.reader`).  Either may name a remote (``s3://bucket/prefix``, ``file:///dir``)
instead of a repository: no local repository on any host (`mvc.dcp.remote`).  See
docs/distributed.md.
"""
from mvc.dcp.asyncsave import async_save
from mvc.dcp.lossy import all_gather, all_sum
from mvc.dcp.reader import DcpLayoutError, MvcStorageReader
from mvc.dcp.remote import RemoteOptionError
from mvc.dcp.writer import (
    DcpOptionError,
    DcpPublishedError,
    DcpValueError,
    Landed,
    MvcStorageWriter,
    save,
)

__all__ = ["DcpLayoutError", "DcpOptionError", "DcpPublishedError", "DcpValueError", "Landed",
           "MvcStorageReader", "MvcStorageWriter", "RemoteOptionError", "all_gather", "all_sum",
           "async_save", "save"]
