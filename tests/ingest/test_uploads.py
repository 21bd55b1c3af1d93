"""Upload classification and validation: kinds from content (never names), and refusals."""

from __future__ import annotations

import gzip
import io
import sqlite3
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.conftest import OWN, PUBLIC_KINETO, PUBLIC_NSYS
from traceguard.errors import InputError, UnsupportedFormatError
from traceguard.ingest.nsys_rep import NSYS_REP_MAGIC
from traceguard.ingest.uploads import Classified, classify, safe_member_name, unpack, validate, validate_sqlite

H200 = OWN / "h200"
BENCH = OWN / "collectives" / "h200x2" / "p2p_graph"


def _renamed(tmp_path: Path, source: Path, name: str = "upload.bin") -> Path:
    """The same bytes under a name that says nothing: the kind must come from the content."""
    target = tmp_path / name
    target.write_bytes(source.read_bytes())
    return target


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (H200 / "p2p_nsys" / "cap_0.sqlite.gz", Classified("nsys-sqlite", True)),
        (H200 / "p2p_torch" / "rank0.trace.json.gz", Classified("kineto", True)),
        (H200 / "p2p_nsys" / "nccl.vm.1734.log", Classified("nccl_log")),
        (H200 / "p2p_nsys" / "dmon.txt", Classified("dmon")),
        (H200 / "topo.txt", Classified("topo")),
        (H200 / "nvidia-smi-q.txt", Classified("smi_q")),
        (BENCH / "nccl-tests.txt", Classified("nccl_tests")),
    ],
    ids=lambda v: v.name if isinstance(v, Path) else v.kind,
)
def test_kind_from_content(tmp_path: Path, source: Path, expected: Classified) -> None:
    assert classify(_renamed(tmp_path, source)) == expected


def test_every_public_capture_is_recognised(tmp_path: Path) -> None:
    for path in PUBLIC_NSYS:
        assert classify(path) == Classified("nsys-sqlite", True), path.name
    for path in PUBLIC_KINETO:
        assert classify(path) == Classified("kineto", True), path.name


def test_plain_sqlite_rep_and_archives(tmp_path: Path, unpacked) -> None:
    assert classify(unpacked(H200 / "p2p_nsys" / "cap_0.sqlite.gz")) == Classified("nsys-sqlite")
    rep = tmp_path / "r"
    rep.write_bytes(NSYS_REP_MAGIC + b"\x00" * 64)
    assert classify(rep) == Classified("nsys-rep")
    tar_path = tmp_path / "t"
    with tarfile.open(tar_path, "w:gz") as tar:
        tar.add(H200 / "topo.txt", arcname="topo.txt")
    assert classify(tar_path) == Classified("tar", True)
    zip_path = tmp_path / "z"
    with zipfile.ZipFile(zip_path, "w") as archive:
        archive.write(H200 / "topo.txt", "topo.txt")
    assert classify(zip_path) == Classified("zip")


def test_unknown_and_empty(tmp_path: Path) -> None:
    text = tmp_path / "notes"
    text.write_text("hello\n")
    with pytest.raises(UnsupportedFormatError, match="not a file traceguard reads"):
        classify(text)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="empty"):
        classify(empty)


def test_sqlite_that_is_not_nsys(tmp_path: Path) -> None:
    path = tmp_path / "app.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    with pytest.raises(InputError, match="not an Nsight Systems export"):
        validate_sqlite(path)


def test_gzip_bomb_is_bounded(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * 5_000_000))
    found = classify(bomb)
    assert found == Classified("kineto", True)
    with pytest.raises(InputError, match="expands to more than 1000000 bytes"):
        validate(bomb, found, scratch=tmp_path, max_expanded_bytes=1_000_000, max_side_bytes=1000)


@pytest.mark.parametrize("name", ["../x", "a/../../x", "/etc/passwd", "a\\..\\x", "ok\x00.txt"])
def test_unsafe_member_names(name: str) -> None:
    with pytest.raises(InputError):
        safe_member_name(name)


def test_member_names_are_normalised() -> None:
    assert safe_member_name("./run/./cap_0.sqlite.gz") == "run/cap_0.sqlite.gz"


def test_archive_limits(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for i in range(5):
            info = tarfile.TarInfo(f"f{i}.txt")
            info.size = 1000
            tar.addfile(info, io.BytesIO(b"x" * 1000))
    path = tmp_path / "many.tar"
    path.write_bytes(buffer.getvalue())
    found = Classified("tar")
    with pytest.raises(InputError, match="more than the limit of 3 members"):
        unpack(path, found, tmp_path / "a", max_members=3, max_bytes=10**9)
    with pytest.raises(InputError, match="expands to more than 2500 bytes"):
        unpack(path, found, tmp_path / "b", max_members=100, max_bytes=2500)
    assert not (tmp_path / "b").exists()  # nothing left behind
    members = unpack(path, found, tmp_path / "c", max_members=100, max_bytes=10**9)
    assert [m.name for m in members] == [f"f{i}.txt" for i in range(5)]
    assert all(m.path.parent == tmp_path / "c" for m in members)
