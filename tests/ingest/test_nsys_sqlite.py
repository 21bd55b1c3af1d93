"""nsys SQLite ingestion against every public fixture, checked against the tests' own SQL.

Expected numbers come from plain ``sqlite3`` queries written here, never from the reader's
output, so the reader and the test cannot share a mistake.
"""

from __future__ import annotations

import gzip
import re
import shutil
import sqlite3
import struct
import subprocess
from pathlib import Path

import polars as pl
import pytest

from tests import nsys_profile
from tests.conftest import PUBLIC_NSYS, public_nsys
from traceguard import model, tools
from traceguard.errors import InputError, ToolNotFoundError
from traceguard.ingest import cache, nsys_rep
from traceguard.ingest.nsys_sqlite import looks_like_nsys, read_nsys_sqlite
from traceguard.ingest.sqlite_safe import open_readonly, real_tables

#: Product and schema versions, as listed in ../shared/fixtures/public/README.md.
VERSIONS = {
    "mfu_2gpu_before": ("2026.2.1", "3.25.0"),
    "h100_2gpu_1s": ("2026.2.1", "3.25.0"),
    "mock": ("2026.1.1", "3.24.14"),
    "healthy_1pct": ("2026.1.1", "3.24.14"),
    "at_ee4fcf3": ("2025.1.1", "3.17.1"),
    "at_8fa9ec2": ("2024.6.2", "3.16.1"),
    "cloverleaf": ("2024.5.1", "3.13.2"),
    "saxpy": ("2022.2.1", "2.9.1"),
}
#: nsys enum names → model names, written out by hand (independent of the reader's rule).
COPY_NAMES = {
    "CUDA_MEMCPY_KIND_UNKNOWN": "unknown",
    "CUDA_MEMCPY_KIND_HTOD": "HtoD",
    "CUDA_MEMCPY_KIND_DTOH": "DtoH",
    "CUDA_MEMCPY_KIND_HTOA": "HtoA",
    "CUDA_MEMCPY_KIND_ATOH": "AtoH",
    "CUDA_MEMCPY_KIND_ATOA": "AtoA",
    "CUDA_MEMCPY_KIND_ATOD": "AtoD",
    "CUDA_MEMCPY_KIND_DTOA": "DtoA",
    "CUDA_MEMCPY_KIND_DTOD": "DtoD",
    "CUDA_MEMCPY_KIND_HTOH": "HtoH",
    "CUDA_MEMCPY_KIND_PTOP": "PtoP",
    "CUDA_MEMCPY_KIND_UVM_HTOD": "unified_HtoD",
    "CUDA_MEMCPY_KIND_UVM_DTOH": "unified_DtoH",
    "CUDA_MEMCPY_KIND_UVM_DTOD": "unified_DtoD",
}
#: The documented constants for exports without ENUM tables (NSYS.md).
COPY_CODES_2022 = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP"}

PROGRAM = ("python3", "-c", "print(1)")
IDS = [p.name.split("__")[-1].removesuffix(".sqlite.gz") for p in PUBLIC_NSYS]


def emit_nvtx_per_op(text: object) -> bool:
    """Whether an NVTX text is one ``emit_nvtx`` writes for an operator or autograd node
    (docs/steps.md, "Per-op ranges"), by a regex rather than the readers' byte tests."""
    return isinstance(text, str) and (
        text.startswith("aten::")
        or ", seq = " in text
        or (", op_id = " in text and re.match(r"[a-z0-9_]+::", text) is not None)
    )


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never write to the user's ~/.cache from tests."""
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))


_READ: dict[Path, model.Capture] = {}


def _capture(db: Path) -> model.Capture:
    if db not in _READ:
        _READ[db] = read_nsys_sqlite(db)
    return _READ[db]


class Truth:
    """What plain SQL says about one export."""

    def __init__(self, db: Path) -> None:
        self.conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        self.tables = {name for (name,) in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}

    def scalar(self, sql: str, table: str, default: int = 0) -> int:
        if table not in self.tables:
            return default
        return self.conn.execute(sql).fetchone()[0] or default

    def copies_by_kind(self) -> dict[str, int]:
        if "CUPTI_ACTIVITY_KIND_MEMCPY" not in self.tables:
            return {}
        if "ENUM_CUDA_MEMCPY_OPER" in self.tables:
            rows = self.conn.execute(
                "SELECT e.name, count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY m "
                "JOIN ENUM_CUDA_MEMCPY_OPER e ON e.id = m.copyKind GROUP BY e.name"
            ).fetchall()
            return {COPY_NAMES[name]: n for name, n in rows}
        rows = self.conn.execute(
            "SELECT copyKind, count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY copyKind"
        ).fetchall()
        return {COPY_CODES_2022[code]: n for code, n in rows}

    def dtoh_bytes(self) -> int:
        if "CUPTI_ACTIVITY_KIND_MEMCPY" not in self.tables:
            return 0
        code = 2
        if "ENUM_CUDA_MEMCPY_OPER" in self.tables:
            code = self.conn.execute(
                "SELECT id FROM ENUM_CUDA_MEMCPY_OPER WHERE name = 'CUDA_MEMCPY_KIND_DTOH'"
            ).fetchone()[0]
        return self.conn.execute(
            "SELECT IFNULL(SUM(bytes), 0) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = ?", (code,)
        ).fetchone()[0]

    def gpu_pids(self) -> set[int]:
        """The processes of the GPU ops: their ``globalPid``, or for a table without one (nsys-ai's
        healthy_1pct) the processes of the runtime calls with the ops' correlation ids."""
        pids: set[int] = set()
        for kind in ("KERNEL", "MEMCPY", "MEMSET"):
            table = f"CUPTI_ACTIVITY_KIND_{kind}"
            if table in self.tables:
                columns = {c for (_, c, *_) in self.conn.execute(f"PRAGMA table_info({table})")}
                if "globalPid" in columns:
                    sql = f"SELECT DISTINCT (globalPid >> 24) & 16777215 FROM {table}"
                else:
                    sql = (
                        f"SELECT DISTINCT (r.globalTid >> 24) & 16777215 FROM {table} g "
                        "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = g.correlationId"
                    )
                pids |= {p for (p,) in self.conn.execute(sql)}
        return pids


@pytest.mark.parametrize("gz", PUBLIC_NSYS, ids=IDS)
def test_counts_match_sql(gz: Path, unpacked) -> None:
    db = unpacked(gz)
    cap = _capture(db)
    truth = Truth(db)
    ops = cap.gpu_ops
    kinds = ops["kind"].cast(pl.String)
    assert (kinds == "kernel").sum() == truth.scalar(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_KERNEL"
    )
    assert (kinds == "memset").sum() == truth.scalar(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_MEMSET"
    )
    copies = ops.filter(pl.col("kind") == "memcpy")
    got = dict(copies.group_by(pl.col("copy_kind").cast(pl.String)).len().iter_rows())
    assert got == truth.copies_by_kind()
    assert (copies.filter(pl.col("copy_kind") == "DtoH")["bytes"].sum() or 0) == truth.dtoh_bytes()
    assert cap.api_calls.height == truth.scalar(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_RUNTIME"
    ) + truth.scalar("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_DRIVER", "CUPTI_ACTIVITY_KIND_DRIVER")
    # PyTorch's per-op ranges (``aten::...`` and other operators') are counted per thread, not kept
    # (nsys_sqlite.OP_RANGE_PREFIX, rows.Skip's ``operators``); told here by a regex of their own.
    truth.conn.create_function("per_op", 1, emit_nvtx_per_op, deterministic=True)
    op_range = "per_op(text)"
    ranges = "FROM NVTX_EVENTS WHERE eventType IN (59, 60)"
    assert cap.ranges.height == truth.scalar(
        f"SELECT count(*) {ranges} AND end IS NOT NULL AND NOT ({op_range})", "NVTX_EVENTS"
    )
    if "NVTX_EVENTS" in truth.tables and "text" in {
        c for (_, c, *_) in truth.conn.execute("PRAGMA table_info(NVTX_EVENTS)")
    }:
        folded = truth.conn.execute(
            f"SELECT (globalTid >> 24) & 16777215, globalTid & 16777215, count(*) {ranges} AND {op_range} GROUP BY 1, 2"
        ).fetchall()
        got_folded = sorted(cap.folded_ranges.iter_rows())
        assert got_folded == sorted(folded)
    assert set(ops["pid"].unique().to_list()) == truth.gpu_pids()
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in truth.tables:
        api_pids = {
            p
            for (p,) in truth.conn.execute(
                "SELECT DISTINCT (globalTid >> 24) & 16777215 FROM CUPTI_ACTIVITY_KIND_RUNTIME"
            )
        }
        assert set(cap.api_calls["pid"].unique().to_list()) == api_pids
    if "TARGET_INFO_GPU" in truth.tables:
        columns = {c for (_, c, *_) in truth.conn.execute("PRAGMA table_info(TARGET_INFO_GPU)")}
        device = "COALESCE(cuDevice, id)" if "cuDevice" in columns else "id"  # healthy_1pct: id, name
        assert cap.devices.height == truth.scalar(
            f"SELECT count(DISTINCT {device}) FROM TARGET_INFO_GPU", "TARGET_INFO_GPU"
        )
    else:
        assert cap.devices.height == 0


@pytest.mark.parametrize("gz", PUBLIC_NSYS, ids=IDS)
def test_schema_versions_and_shape(gz: Path, unpacked) -> None:
    cap = _capture(unpacked(gz))
    product, schema = next(v for key, v in VERSIONS.items() if key in gz.name)
    assert cap.info.tool_version is not None and cap.info.tool_version.startswith(product)
    assert cap.info.schema_version == schema
    assert cap.info.format == "nsys-sqlite" and cap.info.tool == "nsys"
    truth = Truth(unpacked(gz))
    named_host = truth.scalar(
        "SELECT count(*) FROM META_DATA_EXPORT WHERE name = 'EXPORT_HOST'", "META_DATA_EXPORT"
    ) + truth.scalar("SELECT count(*) FROM TARGET_INFO_SYSTEM_ENV WHERE name = 'Hostname'", "TARGET_INFO_SYSTEM_ENV")
    named_host += truth.scalar("SELECT count(*) FROM EXPORT_META_DATA WHERE name = 'EXPORT_HOST'", "EXPORT_META_DATA")
    assert bool(cap.info.host) == bool(named_host)  # healthy_1pct names no host
    for frame, schema_ in (
        (cap.gpu_ops, model.GPU_OPS_SCHEMA),
        (cap.api_calls, model.API_CALLS_SCHEMA),
        (cap.ranges, model.RANGES_SCHEMA),
        (cap.devices, model.DEVICES_SCHEMA),
        (cap.processes, model.PROCESSES_SCHEMA),
        (cap.strings, model.STRINGS_SCHEMA),
    ):
        assert frame.schema == pl.Schema(schema_)
        assert frame["rank"].null_count() == frame.height if "rank" in frame.columns else True
    assert cap.strings["id"].is_unique().all()


@pytest.mark.parametrize("gz", PUBLIC_NSYS, ids=IDS)
def test_names_resolve(gz: Path, unpacked) -> None:
    db = unpacked(gz)
    cap = _capture(db)
    names = cap.name_of()
    assert all(i in names for i in cap.gpu_ops["name_id"].to_list())
    assert all(i in names for i in cap.api_calls["name_id"].to_list())
    assert cap.ranges["name"].null_count() == 0
    truth = Truth(db)
    if "CUPTI_ACTIVITY_KIND_KERNEL" in truth.tables:
        sql_names = {
            v
            for (v,) in truth.conn.execute(
                "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName"
            )
        }
        kernel_ids = cap.gpu_ops.filter(pl.col("kind") == "kernel")["name_id"].unique().to_list()
        assert {names[i] for i in kernel_ids} == sql_names
    copies = cap.gpu_ops.filter(pl.col("kind") == "memcpy")
    for kind, name_id in copies.select(pl.col("copy_kind").cast(pl.String), "name_id").unique().iter_rows():
        assert names[name_id] == f"Memcpy {kind}"


@pytest.mark.parametrize("gz", PUBLIC_NSYS, ids=IDS)
def test_gz_path_reads_the_same(gz: Path, unpacked) -> None:
    plain = _capture(unpacked(gz))
    zipped = read_nsys_sqlite(gz)
    assert zipped.info.path == str(gz)
    for name in ("gpu_ops", "api_calls", "ranges", "devices", "processes", "strings"):
        assert getattr(zipped, name).equals(getattr(plain, name)), name
    again = cache.gunzip_cached(gz)
    assert again == cache.gunzip_cached(gz)  # reused, keyed by content


def test_2022_export_without_enum_tables(unpacked) -> None:
    db = unpacked(public_nsys("saxpy"))
    assert not any(t.startswith("ENUM_") for t in Truth(db).tables)
    cap = _capture(db)
    copies = cap.gpu_ops.filter(pl.col("kind") == "memcpy")
    rows = copies.group_by("copy_kind", "src_kind", "dst_kind").len().sort("copy_kind")
    # SQL: copyKind 1 srcKind 0 dstKind 2 (10 rows); copyKind 2 srcKind 2 dstKind 0 (5 rows).
    assert [tuple(map(str, r)) for r in rows.iter_rows()] == [
        ("HtoD", "pageable", "device", "10"),
        ("DtoH", "device", "pageable", "5"),
    ]
    assert cap.info.nvtx_domains == ["MPI"]
    assert cap.ranges.filter(pl.col("domain") == "MPI").height == 17
    assert cap.ranges.filter(pl.col("domain").is_null()).height == 5


def test_enum_mapping_with_tables(unpacked) -> None:
    cap = _capture(unpacked(public_nsys("h100_2gpu_1s")))
    copies = cap.gpu_ops.filter(pl.col("kind") == "memcpy")
    assert set(copies["copy_kind"].cast(pl.String).to_list()) == {"HtoD", "DtoH", "DtoD"}
    htod = copies.filter(pl.col("copy_kind") == "HtoD")
    assert htod["dst_kind"].cast(pl.String).unique().to_list() == ["device"]


def test_nccl_domain_without_creation_row_is_named_from_its_payload_schemas(unpacked) -> None:
    """mfu_2gpu_before was cut to a window and lost NCCL's domain-create row; NCCL's payload
    schemas (the only ones with "NCCL communicator ID") still name domain 1."""
    db = unpacked(public_nsys("mfu_2gpu_before"))
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    created = conn.execute("SELECT COUNT(*) FROM NVTX_EVENTS WHERE eventType = 75").fetchone()[0]
    nccl_domains = conn.execute(
        "SELECT DISTINCT domainId FROM NVTX_PAYLOAD_SCHEMA_ENTRIES WHERE name = 'NCCL communicator ID'"
    ).fetchall()
    # Less PyTorch's per-op ranges (``aten::`` and other operators'), which are counted, not kept.
    conn.create_function("per_op", 1, emit_nvtx_per_op, deterministic=True)
    by_domain = dict(
        conn.execute("SELECT domainId, COUNT(*) FROM NVTX_EVENTS WHERE NOT per_op(text) GROUP BY domainId").fetchall()
    )
    conn.close()
    assert created == 0 and nccl_domains == [(1,)]
    cap = _capture(db)
    counts = dict(cap.ranges.group_by("domain").len().iter_rows())
    assert counts == {None: by_domain[0], "NCCL": by_domain[1]}
    assert cap.info.nvtx_domains == ["NCCL"]


def test_ranges_nest(unpacked) -> None:
    cap = _capture(unpacked(public_nsys("at_ee4fcf3")))
    ranges = cap.ranges
    assert ranges["range_id"].is_unique().all()
    assert ranges["depth"].max() > 0
    children = ranges.filter(pl.col("depth") > 0)
    assert children["parent"].null_count() == 0
    parents = children.join(ranges, left_on="parent", right_on="range_id", suffix="_p")
    assert (parents["start_p"] <= parents["start"]).all()
    assert (parents["depth_p"] == parents["depth"] - 1).all()


def _mfu_copy(unpacked, db: Path) -> tuple[sqlite3.Connection, int]:
    """A writable copy of mfu_2gpu_before at ``db`` (its binaryData is empty, as NSYS.md saw),
    open, and the offset of NCCL's "Message size [bytes]" payload field."""
    shutil.copy(unpacked(public_nsys("mfu_2gpu_before")), db)
    conn = sqlite3.connect(db)
    (offset,) = conn.execute(
        "SELECT DISTINCT offset FROM NVTX_PAYLOAD_SCHEMA_ENTRIES WHERE name = 'Message size [bytes]'"
    ).fetchone()
    return conn, offset


def test_payload_message_size_decoded(unpacked, tmp_path: Path) -> None:
    """The fixtures' binaryData is empty (as NSYS.md saw), so put a payload into a copy."""
    db = tmp_path / "payload.sqlite"
    conn, offset = _mfu_copy(unpacked, db)
    blob = struct.pack("<QQQ", 0xABCDEF, 123456789, 7)[: offset + 8]
    conn.execute("UPDATE NVTX_EVENTS SET binaryData = ? WHERE domainId = 1", (blob,))
    conn.commit()
    conn.close()
    ranges = read_nsys_sqlite(db).ranges
    domain_1 = ranges.filter(pl.col("domain") == "NCCL")
    assert domain_1.height == 462
    assert domain_1["payload_bytes"].to_list() == [123456789] * 462
    assert (
        ranges.filter(pl.col("domain").is_null())["payload_bytes"].null_count() == 18656 - 18088 - 334
    )  # less the per-op ranges: 18,088 aten:: and 334 of other operators (c10d::, FlashAttnFunc, seq = ...)


def test_payloads_decoded_only_where_a_range_has_a_blob(unpacked, tmp_path: Path) -> None:
    """Blobs on some ranges only (as a real export has them: NCCL's calls, not the millions of
    other ranges): each range with one reads its own fields, every other range none, whatever
    its neighbours hold; a blob in a domain without the fields decodes to nothing."""
    db = tmp_path / "some_payloads.sqlite"
    conn, offset = _mfu_copy(unpacked, db)
    nccl = [r for (r,) in conn.execute("SELECT rowid FROM NVTX_EVENTS WHERE domainId = 1 ORDER BY rowid")]
    sizes = {rowid: 1000 + 7 * i for i, rowid in enumerate(nccl) if i % 3 == 0}
    for rowid, size in sizes.items():  # a bare payload (no header): the size at its offset
        blob = struct.pack("<QQQ", 0xABCDEF, size, 7)[: offset + 8]
        conn.execute("UPDATE NVTX_EVENTS SET binaryData = ? WHERE rowid = ?", (blob, rowid))
    (other,) = conn.execute(
        "SELECT MIN(rowid) FROM NVTX_EVENTS WHERE domainId = 0 AND eventType = 59 AND text NOT LIKE 'aten::%'"
    ).fetchone()
    conn.execute("UPDATE NVTX_EVENTS SET binaryData = ? WHERE rowid = ?", (struct.pack("<QQQ", 1, 2, 3), other))
    by_start = dict(conn.execute("SELECT start, rowid FROM NVTX_EVENTS WHERE domainId = 1"))
    other_start = conn.execute("SELECT start FROM NVTX_EVENTS WHERE rowid = ?", (other,)).fetchone()[0]
    conn.commit()
    conn.close()
    ranges = read_nsys_sqlite(db).ranges
    nccl_ranges = ranges.filter(pl.col("domain") == "NCCL")
    assert nccl_ranges.height == len(nccl) and 0 < len(sizes) < len(nccl)
    got = {by_start[start]: value for start, value in nccl_ranges.select("start", "payload_bytes").iter_rows()}
    assert got == {rowid: sizes.get(rowid) for rowid in nccl}
    assert ranges["payload_peer"].null_count() == ranges.height  # no blob names its schema
    (other_row,) = ranges.filter(pl.col("start") == other_start, pl.col("domain").is_null()).iter_rows(named=True)
    assert other_row["payload_bytes"] is None


def test_sqlite_safe_helpers(unpacked) -> None:
    conn = open_readonly(unpacked(public_nsys("mock")), quick_check=True, deadline=30)
    try:
        assert "StringIds" in real_tables(conn)
        assert looks_like_nsys(conn)
        with pytest.raises(sqlite3.OperationalError):
            conn.execute("CREATE TABLE x(a)")
    finally:
        conn.close()


# -- malformed inputs ------------------------------------------------------------------------


def test_empty_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="empty"):
        read_nsys_sqlite(empty)


def test_truncated_sqlite(unpacked, tmp_path: Path) -> None:
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(unpacked(public_nsys("h100_2gpu_1s")).read_bytes()[:4096])
    with pytest.raises(InputError, match="truncated") as info:
        read_nsys_sqlite(cut)
    assert "nsys export" in str(info.value)


def test_garbage_is_not_a_database(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"hello, this is not sqlite at all\n" * 200)
    with pytest.raises(InputError, match="not a SQLite database"):
        read_nsys_sqlite(junk)


def test_sqlite_that_is_not_nsys(tmp_path: Path) -> None:
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE people(name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(InputError, match="SQLite database but not an nsys export"):
        read_nsys_sqlite(other)


def test_views_are_never_read(tmp_path: Path) -> None:
    """Every expected name as a view over a real table: not an nsys export at all."""
    fake = tmp_path / "views.sqlite"
    conn = sqlite3.connect(fake)
    conn.execute("CREATE TABLE data(id INTEGER, value TEXT, start INTEGER, end INTEGER)")
    conn.execute("INSERT INTO data VALUES (1, 'x', 1, 2)")
    for name in ("StringIds", "META_DATA_EXPORT", "CUPTI_ACTIVITY_KIND_KERNEL", "NVTX_EVENTS"):
        conn.execute(f"CREATE VIEW {name} AS SELECT * FROM data")
    conn.commit()
    conn.close()
    with pytest.raises(InputError, match="not an nsys export"):
        read_nsys_sqlite(fake)


def test_event_table_as_view_is_absent(unpacked, tmp_path: Path) -> None:
    """A real export whose kernel table was replaced by a view: kernels are "not available"."""
    db = tmp_path / "kernel_view.sqlite"
    shutil.copy(unpacked(public_nsys("mock")), db)
    conn = sqlite3.connect(db)
    conn.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME TO hidden")
    conn.execute("CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS SELECT * FROM hidden")
    conn.commit()
    conn.close()
    cap = read_nsys_sqlite(db)
    assert (cap.gpu_ops["kind"] == "kernel").sum() == 0
    assert (cap.gpu_ops["kind"] == "memcpy").sum() == 1


def test_corrupt_gzip(tmp_path: Path) -> None:
    data = public_nsys("mock").read_bytes()
    truncated = tmp_path / "truncated.sqlite.gz"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated"):
        read_nsys_sqlite(truncated)
    garbled = tmp_path / "garbled.sqlite.gz"
    garbled.write_bytes(data[:20] + bytes(b ^ 0x5A for b in data[20:4000]) + data[4000:])
    with pytest.raises(InputError, match="cannot be decompressed"):
        read_nsys_sqlite(garbled)
    assert not list(cache.cache_dir().glob("gunzip/*.part"))


def test_gzip_of_non_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "text.sqlite.gz"
    with gzip.open(path, "wb") as handle:
        handle.write(b"just text\n" * 100)
    with pytest.raises(InputError, match="not a SQLite database"):
        read_nsys_sqlite(path)


# -- .nsys-rep ---------------------------------------------------------------------------------


def _make_report(directory: Path) -> Path:
    """A real, tiny report from the installed nsys (Debian's split layout needs the importer
    run by hand: NSYS.md)."""
    nsys = shutil.which("nsys")
    if nsys is None:
        pytest.fail("`nsys` is not on PATH: install Nsight Systems (CI does) to run this test")
    base = directory / "tiny"
    report = base.with_suffix(".nsys-rep")
    qdstrm = base.with_suffix(".qdstrm")
    command = [nsys, "profile", "--trace=osrt", "--sample=none", "--cpuctxsw=none", "-f", "true", "-o", base, *PROGRAM]
    failed = nsys_profile.profile(command, lambda: report.exists() or qdstrm.exists(), timeout=120)
    assert len(failed) < 2, "\n".join(failed)
    if not report.exists() and qdstrm.exists():
        candidates = [
            Path(nsys).resolve().parent.parent / "host-linux-x64" / "QdstrmImporter",
            Path("/usr/lib/nsight-systems/host-linux-x64/QdstrmImporter"),
        ]
        importer = next((c for c in candidates if c.exists()), None)
        assert importer is not None, "nsys left a .qdstrm and no QdstrmImporter was found"
        subprocess.run([str(importer), "-i", str(qdstrm)], capture_output=True, timeout=120, check=True)
    assert report.exists(), f"nsys did not produce {report}"
    return report


@pytest.mark.slow
def test_nsys_rep_export_roundtrip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path / "cache"))
    report = _make_report(tmp_path)
    assert nsys_rep.is_nsys_rep(report)
    exported = nsys_rep.export_to_sqlite(report)
    cap = read_nsys_sqlite(exported, source_path=str(report))
    assert cap.info.path == str(report)
    version = subprocess.run(["nsys", "--version"], capture_output=True, text=True).stdout
    assert cap.info.tool_version and cap.info.tool_version.split(".")[0] in version
    mtime = exported.stat().st_mtime_ns

    def no_nsys(*args: object, **kwargs: object) -> None:
        raise AssertionError("nsys ran again although the export is cached")

    monkeypatch.setattr(nsys_rep.subprocess, "run", no_nsys)
    assert nsys_rep.export_to_sqlite(report) == exported
    assert exported.stat().st_mtime_ns == mtime


def test_nsys_rep_magic(tmp_path: Path, unpacked) -> None:
    fake = tmp_path / "x.nsys-rep"
    fake.write_bytes(b"NVIDIA Tegra Profiler Report 1.\n\x0bLocal (CLI)")
    assert nsys_rep.is_nsys_rep(fake)
    assert not nsys_rep.is_nsys_rep(unpacked(public_nsys("mock")))
    assert not nsys_rep.is_nsys_rep(tmp_path / "missing.nsys-rep")


def test_missing_nsys_names_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setattr(tools.shutil, "which", lambda name: None)
    monkeypatch.setattr(tools, "NSYS_CANDIDATES", ())
    monkeypatch.delenv("TRACEGUARD_NSYS", raising=False)
    report = tmp_path / "job.nsys-rep"
    report.write_bytes(b"NVIDIA Tegra Profiler Report 1.\n" + b"\0" * 64)
    with pytest.raises(ToolNotFoundError) as info:
        nsys_rep.export_to_sqlite(report)
    assert "nsys export --type sqlite -o job.sqlite job.nsys-rep" in str(info.value)


def test_failed_export_is_an_input_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A damaged report: nsys's own message comes back (uses a fake nsys, so no install needed)."""
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path / "cache"))
    fake = tmp_path / "bin" / "nsys"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'Exportation error: Cannot read from stream.' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(nsys_rep, "find_nsys", lambda: str(fake))
    report = tmp_path / "bad.nsys-rep"
    report.write_bytes(b"NVIDIA Tegra Profiler Report 1.\n" + b"\xff" * 64)
    with pytest.raises(InputError, match="Cannot read from stream"):
        nsys_rep.export_to_sqlite(report)


def test_type_drift_inside_a_column(unpacked, tmp_path: Path) -> None:
    """SQLite columns are loosely typed: a REAL among INTEGERs (after Arrow's type inference has
    settled on int64) must not break the read."""
    db = tmp_path / "drift.sqlite"
    shutil.copy(unpacked(public_nsys("cloverleaf")), db)
    conn = sqlite3.connect(db)
    last = conn.execute("SELECT max(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    end = conn.execute("SELECT end FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = ?", (last,)).fetchone()[0]
    conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = end + 0.5 WHERE rowid = ?", (last,))
    conn.commit()
    conn.close()
    kernels = read_nsys_sqlite(db).gpu_ops.filter(pl.col("kind") == "kernel")
    assert kernels.height == 1312
    assert end in kernels["end"].to_list()


def test_per_op_ranges_are_counted_in_each_rank_s_health(unpacked) -> None:
    """nsys-ai's mfu capture (two ranks in one file, ``emit_nvtx``): each rank's ``ranges`` counts
    the ranges it keeps and its per-op ones (``folded_op_ranges``: ``aten::`` and other
    operators' and autograd nodes'), counted here per process from the texts themselves; the
    kept ones hold no per-op range, and do hold the scopes (``FSDP::pre_forward (...)``,
    ``record_param_comms``) and c10d's ``nccl:`` annotations."""
    from traceguard.ingest import gpu_processes, split_by_process, with_rank
    from traceguard.metrics.rank import analyse_rank

    db = unpacked(public_nsys("mfu_2gpu_before"))
    capture = read_nsys_sqlite(db, launches_only=True, keep_correlation=False)
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    per_pid: dict[int, int] = {}
    outside_default = 0
    for pid, text, domain in conn.execute(
        "SELECT (globalTid >> 24) & 16777215, text, domainId FROM NVTX_EVENTS WHERE eventType IN (59, 60)"
    ):
        per_pid[pid] = per_pid.get(pid, 0) + emit_nvtx_per_op(text)
        outside_default += emit_nvtx_per_op(text) and (domain or 0) != 0
    conn.close()
    assert outside_default == 0
    assert sum(per_pid.values()) == 18088 + 334
    names = capture.ranges["name"]
    assert not names.str.starts_with("aten::").any() and not names.str.contains(", seq = ", literal=True).any()
    assert not names.str.contains(r"^[a-z0-9_]+::.*, op_id = ").any()
    assert names.str.starts_with("FSDP::").sum() == 68  # scopes (pre_/post_forward), not operators: kept
    annotations = names.str.starts_with("nccl:all_to_all, op_id = ").sum()
    assert annotations == names.str.starts_with("record_param_comms").sum() == 66
    pids = gpu_processes(capture)
    assert len(pids) == 2
    for rank, part in split_by_process(capture, pids, 0):
        health = analyse_rank(rank, with_rank(part, rank)).health
        assert health["folded_op_ranges"] == per_pid[pids[rank]] > 8000
        assert health["ranges"] == part.ranges.height + per_pid[pids[rank]]
        # The folded ranges are default-domain ones, as every per-op range of this capture is.
        default = part.ranges.filter(pl.col("domain").is_null()).height
        assert health["default_domain_ranges"] == default + per_pid[pids[rank]]


@pytest.mark.parametrize("name", ["mfu_2gpu_before", "h100_2gpu_1s", "saxpy"])
def test_the_capture_before_its_launches_are_joined_is_the_capture_less_its_launches(name: str, unpacked) -> None:
    """``on_ops`` sees the capture once, before the launch join: the same ranges, strings, devices
    and processes as the capture returned, and the same ops, row for row, without launch values."""
    from polars.testing import assert_frame_equal

    seen: list[model.Capture] = []
    capture = read_nsys_sqlite(
        unpacked(public_nsys(name)), launches_only=True, keep_correlation=False, on_ops=seen.append
    )
    (early,) = seen
    for frame in ("ranges", "strings", "devices", "processes", "folded_ranges"):
        assert_frame_equal(getattr(early, frame), getattr(capture, frame))
    assert early.api_calls.height == 0
    assert early.gpu_ops["correlation_id"].null_count() < early.gpu_ops.height  # not joined yet
    assert not set(model.LAUNCH_SCHEMA) & set(early.gpu_ops.columns)
    plain = [c for c in early.gpu_ops.columns if c not in model.LAUNCH_SCHEMA and c != "correlation_id"]
    assert_frame_equal(early.gpu_ops.select(plain), capture.gpu_ops.select(plain))
