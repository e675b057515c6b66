"""Crafted zip checkpoints: every storage record torch's format does not allow is refused, never read as data.

Each crafted file starts as a real ``torch.save`` file and is edited with
`zipfile` (entries rewritten, records cut, compressed, padded, or the pickle's
storage ids patched), so the tests exercise the same structure torch writes.
"""
from __future__ import annotations

import os
import pickletools
import struct
import subprocess
import sys
import warnings
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
import torch
from checkpoints import assert_identical, assert_same_sharing, realistic_checkpoint
from cli_helpers import run

from mvc.io import CorruptCheckpointError, load_checkpoint, torch_zip
from mvc.repo.repository import Repo

Edit = Callable[[str, bytes], "bytes | None"]


# ----------------------------------------------------------------------------- crafting helpers


def _short(name: str) -> str:
    """An entry name without the archive folder torch puts in front (``ckpt/data/0`` -> ``data/0``)."""
    return name.split("/", 1)[1]


def rewrite(src: Path, dst: Path, *, edit: Edit | None = None, align: int = 64, offset: dict | None = None,
            deflate: tuple[str, ...] = (), zip64: tuple[str, ...] = (), last: str | None = None,
            extra: list[tuple[str, bytes]] | None = None) -> None:
    """Rewrite the entries of `src` into `dst` with `zipfile`.

    `edit(short_name, data)` may change an entry's bytes (None drops it); every
    entry's data starts at a multiple of `align` plus ``offset[short_name]``
    (0 by default), as torch's writer pads it; names in `deflate` are
    compressed, names in `zip64` get zip64 local headers; `last` moves that
    entry to the end; `extra` adds (short name, bytes) entries.
    """
    offset = offset or {}
    with zipfile.ZipFile(src) as zin:
        prefix = zin.namelist()[0].split("/", 1)[0]
        entries = [(info.filename, zin.read(info.filename)) for info in zin.infolist()]
    entries += [(f"{prefix}/{name}", data) for name, data in extra or []]
    if last is not None:
        entries.sort(key=lambda item: _short(item[0]) == last)
    with open(dst, "wb") as handle, zipfile.ZipFile(handle, "w") as zout, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are crafted on purpose
        for name, data in entries:
            short = _short(name)
            if edit is not None:
                data = edit(short, data)
                if data is None:
                    continue
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED if short in deflate else zipfile.ZIP_STORED
            force64 = short in zip64
            if align:
                start = handle.tell() + 30 + len(name.encode()) + 4 + (20 if force64 else 0)
                pad = (offset.get(short, 0) - start) % align
                info.extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
            with zout.open(info, "w", force_zip64=force64) as out:
                out.write(data)


def rewrite_zip64(src: Path, dst: Path, **kwargs: object) -> None:
    """`rewrite` with every zip64 structure: zip64 local and central extra fields, zip64 end of directory."""
    with zipfile.ZipFile(src) as zin:
        names = tuple(_short(n) for n in zin.namelist())
    # zipfile switches to zip64 past these limits; lowering them makes a small file use every zip64 field.
    with mock.patch.object(zipfile, "ZIP64_LIMIT", 0), mock.patch.object(zipfile, "ZIP_FILECOUNT_LIMIT", 0):
        rewrite(src, dst, zip64=names, **kwargs)
    assert b"PK\x06\x06" in dst.read_bytes()  # the zip64 end of central directory record


def data_offsets(path: Path) -> dict[str, int]:
    """Where each entry's data starts in the file (read from its local header)."""
    found = {}
    with open(path, "rb") as handle, zipfile.ZipFile(handle) as archive:
        for info in archive.infolist():
            handle.seek(info.header_offset)
            header = handle.read(30)
            n, m = struct.unpack("<HH", header[26:30])
            found[_short(info.filename)] = info.header_offset + 30 + n + m
    return found


def patch_central(path: Path, short: str, *, size: int | None = None, header_to: str | None = None) -> None:
    """Patch one entry's central directory record: its sizes, or where its local header is said to be."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        pos = archive.start_dir
        headers = {_short(info.filename): info.header_offset for info in archive.infolist()}
    while data[pos:pos + 4] == b"PK\x01\x02":
        n, m, k = struct.unpack("<HHH", data[pos + 28:pos + 34])
        if _short(data[pos + 46:pos + 46 + n].decode()) == short:
            if size is not None:
                data[pos + 20:pos + 28] = struct.pack("<II", size, size)
            if header_to is not None:
                data[pos + 42:pos + 46] = struct.pack("<I", headers[header_to])
            path.write_bytes(bytes(data))
            return
        pos += 46 + n + m + k
    raise AssertionError(f"no central directory entry {short}")


def pid_ops(pickle_bytes: bytes) -> list[tuple[int, int]]:
    """For each storage id in the pickle: (index of its numel op, index of the op after BINPERSID)."""
    ops = list(pickletools.genops(pickle_bytes))
    found = []
    for i, (op, _arg, _pos) in enumerate(ops):
        if op.name == "BINPERSID":
            tup = max(j for j in range(i) if ops[j][0].name == "TUPLE")
            found.append((tup - 1, i + 1))
    return found


def replace_op(pickle_bytes: bytes, index: int, new: bytes) -> bytes:
    ops = list(pickletools.genops(pickle_bytes))
    start, end = ops[index][2], ops[index + 1][2]
    return pickle_bytes[:start] + new + pickle_bytes[end:]


def int_op(value: int) -> bytes:
    return b"J" + struct.pack("<i", value)


def replace_once(data: bytes, old: bytes, new: bytes) -> bytes:
    assert data.count(old) == 1, (old, data.count(old))
    return data.replace(old, new)


def on(target: str, change: Callable[[bytes], bytes]) -> Edit:
    return lambda short, data: change(data) if short == target else data


def patch_numel(delta: int) -> Edit:
    def change(pkl: bytes) -> bytes:
        numel_op, _ = pid_ops(pkl)[0]
        value = list(pickletools.genops(pkl))[numel_op][1]
        return replace_op(pkl, numel_op, int_op(value + delta))
    return on("data.pkl", change)


def patch_rebuild_arg(step: int, value: int) -> Edit:
    """Patch the int `step` ops after the first BINPERSID: 0 = storage offset, 1 = size[0], 4 = stride[0]."""
    def change(pkl: bytes) -> bytes:
        _, after = pid_ops(pkl)[0]
        return replace_op(pkl, after + step, int_op(value))
    return on("data.pkl", change)


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture
def one_tensor(tmp_path: Path) -> Path:
    """A real torch.save file holding one float32 tensor of 10 elements (record data/0, 40 bytes)."""
    path = tmp_path / "src.pt"
    torch.save({"w": torch.arange(10, dtype=torch.float32)}, path)
    return path


def refused(path: Path, record: str | None = "data/0") -> str:
    """Assert the API refuses `path` with the corrupt-checkpoint error; return its one-line message."""
    with pytest.raises(CorruptCheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert info.value.exit_code == 21
    assert "\n" not in message and str(path) in message, message
    if record is not None:
        assert record in message, message
    return message


def view_heavy_state() -> dict:
    base = torch.randn(6, 5)
    shared = torch.arange(12, dtype=torch.float64)
    return {
        "base": base,
        "transposed": base.t(),                       # non-contiguous view of base
        "slice": base[2:, 1:4],                       # view with a storage offset
        "expanded": torch.randn(3, 1).expand(3, 4),   # stride 0
        "tied_a": shared, "tied_b": shared,           # the same tensor twice
        "shared_view": shared[5:].view(7, 1),
        "bf16": torch.randn(4, 3).to(torch.bfloat16),
        "half": torch.randn(5).half(),
        "scalar": torch.tensor(3.5),                  # 0-dim
        "empty": torch.empty(0),
        "empty2d": torch.empty(0, 7, dtype=torch.int32),
        "bool": torch.tensor([True, False, True]),
        "int8": torch.arange(-4, 4, dtype=torch.int8),
        "complex": torch.randn(3, dtype=torch.complex64),
        "f8": torch.randn(4).to(torch.float8_e4m3fn),
        "param": torch.nn.Parameter(torch.randn(2, 2)),
        "nested": {"list": [torch.ones(2), (torch.zeros(1, dtype=torch.int64),)]},
    }


# ----------------------------------------------------------------------------- valid files still load


@pytest.mark.parametrize("make", [realistic_checkpoint, view_heavy_state], ids=["realistic", "views"])
def test_valid_checkpoints_load_bit_identically(tmp_path: Path, make: Callable[[], dict]) -> None:
    state = make()
    path = tmp_path / "ok.pt"
    torch.save(state, path)
    out = load_checkpoint(path)
    reference = torch.load(path, weights_only=False, mmap=False)
    assert_identical(reference, out)
    assert_same_sharing(reference, out)
    assert_identical(state, out)
    assert_same_sharing(state, out)


@pytest.mark.parametrize("variant", ["rewritten", "zip64-records", "zip64-everything"])
def test_valid_rewritten_zips_load_bit_identically(tmp_path: Path, variant: str) -> None:
    state = view_heavy_state()
    src, path = tmp_path / "src.pt", tmp_path / "ok.pt"
    torch.save(state, src)
    with zipfile.ZipFile(src) as archive:
        records = tuple(_short(n) for n in archive.namelist() if "/data/" in n)
    if variant == "zip64-everything":
        rewrite_zip64(src, path)
    else:
        rewrite(src, path, zip64=records if variant == "zip64-records" else ())
    assert all(offset % 64 == 0 for offset in data_offsets(path).values())
    out = load_checkpoint(path)
    assert_identical(state, out)
    assert_same_sharing(state, out)


def test_big_endian_file_loads_byteswapped(tmp_path: Path) -> None:
    base = torch.randn(3, 4)
    state = {"a": base, "t": base.t(), "s": base[1:], "scalar": torch.tensor(2.5), "empty": torch.empty(0)}
    src, path = tmp_path / "src.pt", tmp_path / "big.pt"
    torch.save(state, src)

    def to_big_endian(short: str, data: bytes) -> bytes:
        if short == "byteorder":
            return b"big"
        if short.startswith("data/"):  # every storage here is float32
            return b"".join(data[i:i + 4][::-1] for i in range(0, len(data), 4))
        return data

    rewrite(src, path, edit=to_big_endian)
    out = load_checkpoint(path)
    assert_identical(state, out)
    assert_same_sharing(state, out)


# ----------------------------------------------------------------------------- crafted records are refused


def _short_record(src: Path, dst: Path) -> None:
    rewrite(src, dst, edit=on("data/0", lambda d: d[:8]))


def _oversized_record(src: Path, dst: Path) -> None:
    rewrite(src, dst, edit=on("data/0", lambda d: d + bytes(64)))


def _deflated_record(src: Path, dst: Path) -> None:
    rewrite(src, dst, deflate=("data/0",))


def _misaligned_record(src: Path, dst: Path) -> None:
    rewrite(src, dst, offset={"data/0": 4})


def _unaligned_zip(src: Path, dst: Path) -> None:
    rewrite(src, dst, align=0)  # what a plain zip tool writes: records wherever they fall
    assert data_offsets(dst)["data/0"] % 4, "the crafted record happens to be aligned"


def _numel_up(src: Path, dst: Path) -> None:
    rewrite(src, dst, edit=patch_numel(+2))


def _numel_down(src: Path, dst: Path) -> None:
    rewrite(src, dst, edit=patch_numel(-2))


def _dtype_double(src: Path, dst: Path) -> None:
    rewrite(src, dst, edit=on("data.pkl", lambda p: replace_once(p, b"torch\nFloatStorage\n", b"torch\nDoubleStorage\n")))


def _dtype_half(src: Path, dst: Path) -> None:
    rewrite(src, dst, edit=on("data.pkl", lambda p: replace_once(p, b"torch\nFloatStorage\n", b"torch\nHalfStorage\n")))


def _short_record_zip64(src: Path, dst: Path) -> None:
    rewrite_zip64(src, dst, edit=on("data/0", lambda d: d[:8]))


def _oversized_record_zip64(src: Path, dst: Path) -> None:
    rewrite_zip64(src, dst, edit=on("data/0", lambda d: d + bytes(64)))


def _missing_record(src: Path, dst: Path) -> None:
    rewrite(src, dst, edit=lambda short, data: None if short == "data/0" else data)


def _duplicate_record(src: Path, dst: Path) -> None:
    rewrite(src, dst, extra=[("data/0", bytes(40))])


def _runs_into_central_directory(src: Path, dst: Path) -> None:
    # The record is the last entry; the pickle and the central directory agree on 10 + 16 elements,
    # so the extra 64 bytes would come from the central directory itself.
    rewrite(src, dst, edit=patch_numel(+16), last="data/0")
    patch_central(dst, "data/0", size=40 + 64)


def _runs_into_next_entry(src: Path, dst: Path) -> None:
    rewrite(src, dst, edit=patch_numel(+16))
    patch_central(dst, "data/0", size=40 + 64)


def _header_elsewhere(src: Path, dst: Path) -> None:
    # The central directory sends data/0 to another entry's local header (and so to its bytes).
    rewrite(src, dst)
    patch_central(dst, "data/0", header_to="version")


def _storage_offset_out_of_bounds(src: Path, dst: Path) -> None:
    rewrite(src, dst, edit=patch_rebuild_arg(0, 3))


def _size_out_of_bounds(src: Path, dst: Path) -> None:
    rewrite(src, dst, edit=patch_rebuild_arg(1, 11))


def _stride_out_of_bounds(src: Path, dst: Path) -> None:
    rewrite(src, dst, edit=patch_rebuild_arg(4, 2))


def _negative_stride(src: Path, dst: Path) -> None:
    rewrite(src, dst, edit=patch_rebuild_arg(4, -1))


CRAFTED = {
    "short": _short_record,
    "oversized": _oversized_record,
    "deflated": _deflated_record,
    "misaligned": _misaligned_record,
    "unaligned-zip": _unaligned_zip,
    "numel-up": _numel_up,
    "numel-down": _numel_down,
    "dtype-double": _dtype_double,
    "dtype-half": _dtype_half,
    "short-zip64": _short_record_zip64,
    "oversized-zip64": _oversized_record_zip64,
    "missing": _missing_record,
    "duplicate": _duplicate_record,
    "into-central-directory": _runs_into_central_directory,
    "into-next-entry": _runs_into_next_entry,
    "header-elsewhere": _header_elsewhere,
}
# Caught when the tensor is rebuilt on its (exactly sized) storage: the message names the file.
CRAFTED_REBUILD = {
    "offset-oob": _storage_offset_out_of_bounds,
    "size-oob": _size_out_of_bounds,
    "stride-oob": _stride_out_of_bounds,
    "negative-stride": _negative_stride,
}


@pytest.mark.parametrize("kind", list(CRAFTED))
def test_crafted_storage_record_is_refused_by_the_api(one_tensor: Path, tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.pt"
    CRAFTED[kind](one_tensor, path)
    refused(path)


@pytest.mark.parametrize("kind", list(CRAFTED_REBUILD))
def test_crafted_tensor_geometry_is_refused_by_the_api(one_tensor: Path, tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.pt"
    CRAFTED_REBUILD[kind](one_tensor, path)
    refused(path, record=None)


def test_torch_itself_refuses_the_size_mismatches(one_tensor: Path, tmp_path: Path) -> None:
    """The premise: torch's own (copying) reader refuses these, so returning data for them is wrong."""
    for kind in ("short", "oversized", "numel-up", "numel-down", "dtype-double"):
        path = tmp_path / f"{kind}.pt"
        CRAFTED[kind](one_tensor, path)
        with pytest.raises(RuntimeError, match="record size"):
            torch.load(path, weights_only=True, mmap=False)


def test_one_record_read_as_two_dtypes_is_refused(tmp_path: Path) -> None:
    # Both storages are 40 bytes, so only the dtype tells them apart; torch.save never writes this.
    src, path = tmp_path / "src.pt", tmp_path / "two-dtypes.pt"
    torch.save({"a": torch.arange(10, dtype=torch.float32), "b": torch.arange(5, dtype=torch.float64)}, src)
    rewrite(src, path, edit=on("data.pkl", lambda p: replace_once(p, b"X\x01\x00\x00\x001", b"X\x01\x00\x00\x000")))
    message = refused(path)
    assert "float32" in message and "float64" in message


def test_views_of_one_record_with_one_dtype_are_legal(tmp_path: Path) -> None:
    base = torch.arange(24, dtype=torch.float32)
    state = {"a": base, "b": base[4:].view(4, 5), "c": base.view(4, 6).t(), "d": base[::2]}
    path = tmp_path / "views.pt"
    torch.save(state, path)
    with zipfile.ZipFile(path) as archive:
        assert sum("/data/" in n for n in archive.namelist()) == 1
    out = load_checkpoint(path)
    assert_identical(state, out)
    assert_same_sharing(state, out)


@pytest.mark.parametrize("cut", [1, 100, 0.5, -1, -22, -60])
def test_truncated_zip_checkpoints_are_refused(tmp_path: Path, cut: float) -> None:
    src, path = tmp_path / "src.pt", tmp_path / "cut.pt"
    torch.save(view_heavy_state(), src)
    data = src.read_bytes()
    end = int(len(data) * cut) if isinstance(cut, float) else (cut if cut > 0 else len(data) + cut)
    path.write_bytes(data[:end])
    refused(path, record=None)


def test_sparse_tensors_still_load(tmp_path: Path) -> None:
    sparse = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (3,), check_invariants=True)
    path = tmp_path / "sparse.pt"
    torch.save({"s": sparse, "dense": torch.ones(2)}, path)
    out = load_checkpoint(path)
    assert torch.equal(out["s"].to_dense(), sparse.to_dense()) and torch.equal(out["dense"], torch.ones(2))


def test_without_torch_internals_the_copying_reader_still_refuses(
        one_tensor: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """If torch moves the private pieces of the fast path, loading falls back to torch's size-checking copy."""
    monkeypatch.delattr(torch, "_weights_only_unpickler")
    monkeypatch.setitem(sys.modules, "torch._weights_only_unpickler", None)  # torch.serialization keeps its own
    assert_identical(load_checkpoint(one_tensor), torch.load(one_tensor, weights_only=True))
    deflated = tmp_path / "deflated.pt"
    _deflated_record(one_tensor, deflated)  # torch's copy inflates it: the record's own bytes, not the zip's
    assert torch.equal(load_checkpoint(deflated)["w"], torch.arange(10, dtype=torch.float32))
    for kind in ("short", "oversized", "numel-up", "dtype-double"):
        path = tmp_path / f"{kind}.pt"
        CRAFTED[kind](one_tensor, path)
        refused(path, record=None)


# ----------------------------------------------------------------------------- through the command line


@pytest.fixture
def work(work: Path) -> Path:
    """The shared lossless working directory with one commit of `base.pt`."""
    torch.save({"w": torch.ones(3)}, work / "base.pt")
    assert run(work, "commit", "-m", "base", "base.pt")[0] == 0
    return work


def _repo_state(work: Path) -> tuple:
    with Repo(work) as repo:
        return repo.head(), sorted(repo.store.blobs.iter_ids())


def test_mvc_commit_refuses_every_crafted_file_and_leaves_the_repo_unchanged(work: Path) -> None:
    src = work / "src.pt"
    torch.save({"w": torch.arange(10, dtype=torch.float32)}, src)
    before = _repo_state(work)
    for kind, craft in {**CRAFTED, **CRAFTED_REBUILD}.items():
        path = work / f"{kind}.pt"
        craft(src, path)
        code, out, err = run(work, "commit", "-m", kind, path.name)
        assert code == 21, (kind, code, err)
        assert err.count("\n") == 1 and "Traceback" not in err and path.name in err, (kind, err)
        assert out == ""
    assert _repo_state(work) == before


def test_installed_mvc_refuses_a_short_record(work: Path) -> None:
    src, path = work / "src.pt", work / "short.pt"
    torch.save({"w": torch.arange(10, dtype=torch.float32)}, src)
    _short_record(src, path)
    before = _repo_state(work)
    exe = Path(sys.executable).with_name("mvc")
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "mvc"]
    proc = subprocess.run([*command, "commit", "-m", "short", "short.pt"], check=False, cwd=work,
                          capture_output=True,
                          text=True, env={**os.environ, "MVC_DEBUG": ""})
    assert proc.returncode == 21, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "short.pt" in proc.stderr and "data/0" in proc.stderr
    assert _repo_state(work) == before


# ----------------------------------------------------------------------------- bit rot: CRC-32 of every record read


def flip_byte(src: Path, dst: Path, short: str, at: int) -> None:
    """Copy `src` to `dst` with one bit flipped in byte `at` (negative: from the end) of record `short`'s data."""
    with zipfile.ZipFile(src) as archive:
        size = next(i.file_size for i in archive.infolist() if _short(i.filename) == short)
    data = bytearray(src.read_bytes())
    data[data_offsets(src)[short] + at % size] ^= 0x10
    dst.write_bytes(bytes(data))


def patch_crc(path: Path, short: str) -> None:
    """Change one entry's CRC-32 in the central directory (its bytes stay as they are)."""
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as archive:
        pos = archive.start_dir
    while data[pos:pos + 4] == b"PK\x01\x02":
        n, m, k = struct.unpack("<HHH", data[pos + 28:pos + 34])
        if _short(data[pos + 46:pos + 46 + n].decode()) == short:
            data[pos + 16] ^= 0x01
            path.write_bytes(bytes(data))
            return
        pos += 46 + n + m + k
    raise AssertionError(f"no central directory entry {short}")


# (record, byte): storage records first, middle and last byte; the pickle; metadata mvc reads; one only torch reads.
FLIPS = {"data-first": ("data/0", 0), "data-middle": ("data/0", 20), "data-last": ("data/0", -1),
         "second-storage": ("data/1", 3), "pickle": ("data.pkl", 10), "byteorder": ("byteorder", 0),
         "version": ("version", 0)}


@pytest.fixture
def two_tensors(tmp_path: Path) -> Path:
    path = tmp_path / "src.pt"
    torch.save({"w": torch.arange(10, dtype=torch.float32), "b": torch.ones(3, dtype=torch.float64)}, path)
    return path


def test_torch_itself_loads_a_bit_rotted_record(two_tensors: Path, tmp_path: Path) -> None:
    """The premise: torch checks no CRC, so a flipped storage byte comes back as a different value."""
    path = tmp_path / "rotted.pt"
    flip_byte(two_tensors, path, "data/0", 20)
    assert not torch.equal(torch.load(path, weights_only=True)["w"], torch.arange(10, dtype=torch.float32))


def test_parallel_crc32_is_zlibs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_zip, "_CRC_PIECE", 16)
    data = torch.randint(0, 256, (200,), dtype=torch.uint8).numpy()
    for n in (0, 1, 15, 16, 17, 32, 33, 48, 199, 200):
        assert torch_zip.parallel_crc32(data[:n]) == zlib.crc32(data[:n].tobytes()), n


@pytest.mark.parametrize("piece", [8 << 20, 16], ids=["whole", "pieces"])
@pytest.mark.parametrize("kind", list(FLIPS))
def test_one_flipped_byte_in_any_record_read_is_refused(
        two_tensors: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, piece: int) -> None:
    monkeypatch.setattr(torch_zip, "_CRC_PIECE", piece)  # 16: the 40- and 24-byte storages in pieces
    record, at = FLIPS[kind]
    path = tmp_path / f"{kind}.pt"
    flip_byte(two_tensors, path, record, at)
    assert "CRC-32" in refused(path, record=f"src/{record}")
    assert_identical(load_checkpoint(two_tensors), torch.load(two_tensors, weights_only=True))  # the source still loads


def test_crc_is_checked_for_compressed_metadata_and_in_zip64(two_tensors: Path, tmp_path: Path) -> None:
    deflated, wide = tmp_path / "deflated.pt", tmp_path / "zip64.pt"
    rewrite(two_tensors, deflated, deflate=("data.pkl", "version"))
    rewrite_zip64(two_tensors, wide)
    for path in (deflated, wide):
        assert_identical(load_checkpoint(path), torch.load(two_tensors, weights_only=True))
    for path, record in ((deflated, "data.pkl"), (deflated, "version"), (wide, "data/1"), (wide, "data.pkl")):
        patch_crc(path, record)
        assert "CRC-32" in refused(path, record=f"src/{record}")
        patch_crc(path, record)  # back to the valid file for the next record


def test_without_torch_internals_bit_rot_is_still_refused(
        two_tensors: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch, "_weights_only_unpickler")
    monkeypatch.setitem(sys.modules, "torch._weights_only_unpickler", None)
    path = tmp_path / "rotted.pt"
    flip_byte(two_tensors, path, "data/0", 20)
    assert "CRC-32" in refused(path, record="src/data/0")


def test_mvc_commit_refuses_a_bit_rotted_file_and_main_does_not_move(work: Path) -> None:
    src = work / "src.pt"
    torch.save({"w": torch.arange(10, dtype=torch.float32), "b": torch.ones(3, dtype=torch.float64)}, src)
    before = _repo_state(work)
    for kind, (record, at) in FLIPS.items():
        flip_byte(src, work / "x.pt", record, at)
        code, out, err = run(work, "commit", "-m", "x", "x.pt")
        assert code == 21 and out == "", (kind, code, err)
        assert err.count("\n") == 1 and "Traceback" not in err and "x.pt" in err and f"src/{record}" in err, err
        assert "CRC-32" in err, err
    assert _repo_state(work) == before
    (work / "x.pt").write_bytes(src.read_bytes())
    assert run(work, "commit", "-m", "x", "x.pt")[0] == 0  # the same file without the flip commits
    assert _repo_state(work) != before
