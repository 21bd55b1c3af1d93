"""The readers under fuzz: seeds (real inputs), how each is damaged, and how each is read.

A reader passes an input when it returns or raises a :class:`~traceguard.errors.TraceguardError`
whose message names the file; anything else (another exception type, a message that does not say
which file) is a finding. :func:`campaign` runs ``examples`` seeded mutations of one reader and
counts the outcomes; the tests run it with a small budget, ``python -m tests.fuzz.run`` with a
large one.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import random
import shutil
import signal
import tarfile
import time
import traceback
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests import nsys_profile
from tests.conftest import OWN, PUBLIC
from tests.fuzz import mutate
from traceguard.errors import TraceguardError

REPO = Path(__file__).resolve().parents[2]
#: Committed inputs that once crashed a reader, one folder per reader.
REGRESSIONS = REPO / "tests" / "fixtures" / "fuzz"
SIDE = OWN / "side"

Mutator = Callable[[Path, Path, random.Random], str]


def _gunzip(path: Path) -> bytes:
    return gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()


def _bytes_mutator(kind: Callable[[bytes, random.Random], tuple[str, bytes]]) -> Mutator:
    def apply(seed: Path, target: Path, rng: random.Random) -> str:
        how, data = kind(seed.read_bytes(), rng)
        target.write_bytes(data)
        return how

    return apply


def _kineto_mutator(seed: Path, target: Path, rng: random.Random) -> str:
    how, data = mutate.mutate_json(seed.read_bytes(), rng)
    roll = rng.random()
    if roll < 0.15:  # the gzip path: a good stream of bad JSON
        data, how = gzip.compress(data, compresslevel=1, mtime=0), how + "+gzip"
    elif roll < 0.25:  # or a damaged stream
        inner, data = mutate.mutate_bytes(gzip.compress(data, compresslevel=1, mtime=0), rng)
        how = f"{how}+gzip_{inner}"
    target.write_bytes(data)
    return how


def _sqlite_mutator(seed: Path, target: Path, rng: random.Random) -> str:
    return mutate.mutate_sqlite(seed, target, rng)


def _profile_mutator(seed: Path, target: Path, rng: random.Random) -> str:
    how, data = mutate.mutate_text(seed.read_bytes(), rng)
    target.write_bytes(data)
    return how


def _bundle(seed: Path, target: Path, rng: random.Random) -> str:
    """A run-bundle directory whose manifest.json is damaged (the seed is a manifest)."""
    target.mkdir()
    how, data = mutate.mutate_json(seed.read_bytes(), rng)
    (target / "manifest.json").write_bytes(data)
    return how


def _archive_members(rng: random.Random) -> list[tuple[str, bytes]]:
    log = sorted((OWN / "nccl_logs").glob("*.log"))[rng.randrange(5)]
    manifest = {"captures": [{"path": "rank0.json", "rank": 0}], "world_size": 1}
    return [
        ("run/manifest.json", json.dumps(manifest).encode()),
        ("run/nccl.log", log.read_bytes()),
        ("run/dmon.txt", (SIDE / "dmon_leimao_default.txt").read_bytes()),
        ("run/rank0.json", (PUBLIC / "kineto" / KINETO_SEED_NAMES[0]).read_bytes()),
    ]


def _archive_mutator(seed: Path, target: Path, rng: random.Random) -> str:
    """A tar, tar.gz or zip of a small run bundle, then its bytes (or a member's bytes) damaged."""
    members = _archive_members(rng)
    if rng.random() < 0.3:  # damage a member before packing
        index = rng.randrange(len(members))
        name, data = members[index]
        members[index] = (name, mutate.mutate_bytes(data, rng)[1])
    if rng.random() < 0.1:  # hostile names
        members.append((rng.choice(("../evil", "/abs", "run/../../x", "run/\x00", "")), b"x"))
    kind = seed.name  # "tar", "tar.gz" or "zip"
    buffer = io.BytesIO()
    if kind == "zip":
        with zipfile.ZipFile(buffer, "w") as archive:
            for name, data in members:
                archive.writestr(name or "empty", data)
    else:
        with tarfile.open(fileobj=buffer, mode="w:gz" if kind == "tar.gz" else "w") as archive:
            for name, data in members:
                info = tarfile.TarInfo(name or "empty")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    how, data = mutate.mutate_bytes(buffer.getvalue(), rng) if rng.random() < 0.7 else ("none", buffer.getvalue())
    target.write_bytes(data)
    return f"{kind}_{how}"


NSYS_REP_MAGIC = b"NVIDIA Tegra Profiler Report "
_NVTX_JOB = """
import time
import nvtx
for step in range(3):
    with nvtx.annotate(f"Batch {step}"):
        with nvtx.annotate("forward"):
            time.sleep(0.02)
"""


def nsys_rep_seeds() -> list[Path]:
    """A real .nsys-rep, made here by ``nsys profile`` (CPU, NVTX) once per machine and kept in the temp
    directory: a report records the profiled process's environment, so none is committed. [] without nsys."""
    import subprocess
    import sys
    import tempfile

    from traceguard.tools import find_importer, find_nsys

    folder = Path(tempfile.gettempdir()) / "traceguard-fuzz-nsys-rep"
    report = folder / "job.nsys-rep"
    nsys = find_nsys()
    if report.is_file() or nsys is None:
        return [report] if report.is_file() else []
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.py").write_text(_NVTX_JOB)
    command = [nsys, "profile", "--trace=nvtx,osrt", "--sample=none", "--cpuctxsw=none", "--force-overwrite=true"]
    stream = folder / "job.qdstrm"
    nsys_profile.profile(  # no seed from nsys when it fails twice: the other targets still run
        [*command, "-o", folder / "job", sys.executable, folder / "job.py"],
        lambda: report.is_file() or stream.is_file(),
        timeout=300,
        cwd=folder,
        env={"PATH": os.environ.get("PATH", "")},
    )
    if not report.is_file() and stream.is_file() and (importer := find_importer(nsys)):
        subprocess.run([importer, "-i", str(stream)], capture_output=True, timeout=300, cwd=folder)
    stream.unlink(missing_ok=True)
    return [report] if report.is_file() else []


def _nsys_rep_mutator(seed: Path, target: Path, rng: random.Random) -> str:
    """Damaged report bytes; the magic is kept most of the time so that ``nsys export`` gets to read it."""
    how, data = mutate.mutate_bytes(seed.read_bytes(), rng)
    if rng.random() < 0.9 and not data.startswith(NSYS_REP_MAGIC):
        data = NSYS_REP_MAGIC + data[len(NSYS_REP_MAGIC) :]
    target.write_bytes(data)
    return how


# -- what is read ---------------------------------------------------------------------------------


def read_nsys(path: Path) -> None:
    """The CLI's path (sniff + read, launches only) and the service's intake check."""
    from traceguard.ingest import read_capture
    from traceguard.ingest.uploads import classify, validate

    with contextlib.suppress(TraceguardError):  # the reader must still refuse it cleanly on its own
        validate(path, classify(path), scratch=path.parent, max_expanded_bytes=1 << 30, max_side_bytes=64 << 20)
    read_capture(path)


def read_nsys_rep(path: Path) -> None:
    """Sniffed as a report, exported by the machine's ``nsys`` (cached by content), then read."""
    from traceguard.ingest import read_capture

    read_capture(path)


def read_kineto(path: Path) -> None:
    from traceguard.ingest import read_capture

    read_capture(path)


def read_nccl_log(path: Path) -> None:
    from traceguard.ingest.nccl_log import read_nccl_logs

    read_nccl_logs([path])


def _side_reader(kind: str) -> Callable[[Path], None]:
    def read(path: Path) -> None:
        from traceguard.ingest.sides import SideFiles, load_side

        data = load_side(SideFiles(**{kind: [path]}))
        for problem in data.errors:
            if path.name not in problem:
                raise AssertionError(f"side-input error does not name the file: {problem}")

    return read


def read_bundle(path: Path) -> None:
    from traceguard.ingest import bundle_captures
    from traceguard.service.intake import _manifest_ranks

    bundle_captures(path)
    _manifest_ranks({"run/manifest.json": path / "manifest.json"})


def read_archive(path: Path) -> None:
    """What the service's intake does with an upload, store left out: classify, unpack, validate."""
    from traceguard.errors import UnsupportedFormatError
    from traceguard.ingest.uploads import classify, unpack, validate

    found = classify(path)
    if not found.is_archive:
        validate(path, found, scratch=path.parent, max_expanded_bytes=1 << 26, max_side_bytes=1 << 24)
        return
    members = unpack(path, found, path.parent / "members", max_members=50, max_bytes=1 << 26)
    for member in members:
        try:
            kind = classify(member.path)
        except UnsupportedFormatError:
            continue
        if not kind.is_archive:
            validate(member.path, kind, scratch=path.parent, max_expanded_bytes=1 << 26, max_side_bytes=1 << 24)


def read_profile(path: Path) -> None:
    from traceguard.checks.profiles import load_profile

    load_profile(str(path))


# -- the readers --------------------------------------------------------------------------------

NSYS_SEED_NAMES = (
    "GindaChen__nsys-ai__tests__fixtures__mock.sqlite.gz",
    "NVIDIA__Fuser__report1.sqlite__at_8fa9ec2.sqlite.gz",
    "hpcgroup__pipit__pipit__tests__data__saxpy-mpi-cuda_nsys_perlmutter0.sqlite.gz",
)
KINETO_SEED_NAMES = (
    "facebookresearch__HolisticTraceAnalysis__tests__data__amd_trace__mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "facebookresearch__HolisticTraceAnalysis__tests__data__trace_filter__sampled_rank-0.json.gz",
    "facebookresearch__HolisticTraceAnalysis__tests__data__nccl_parser_config__nccl_data.json.gz",
)


@dataclass(frozen=True)
class Reader:
    name: str
    seeds: Callable[[], list[Path]]  # real inputs, as stored (may be .gz)
    mutator: Mutator
    read: Callable[[Path], None]
    suffix: str = ""  # the damaged copy's file name suffix
    unpack_seed: bool = True  # gunzip .gz seeds before mutating
    names_file: bool = True  # its errors must name the file


def _glob(folder: Path, pattern: str) -> Callable[[], list[Path]]:
    return lambda: sorted(folder.glob(pattern))


def _fixed(paths: list[Path]) -> Callable[[], list[Path]]:
    return lambda: paths


def _archive_kinds() -> list[Path]:
    return [Path("tar"), Path("tar.gz"), Path("zip")]


READERS: dict[str, Reader] = {
    reader.name: reader
    for reader in (
        Reader(
            "nsys_sqlite",
            _fixed([PUBLIC / "nsys-sqlite" / name for name in NSYS_SEED_NAMES]),
            _sqlite_mutator,
            read_nsys,
            ".sqlite",
        ),
        Reader("nsys_rep", nsys_rep_seeds, _nsys_rep_mutator, read_nsys_rep, ".nsys-rep", unpack_seed=False),
        Reader(
            "kineto",
            _fixed([PUBLIC / "kineto" / name for name in KINETO_SEED_NAMES]),
            _kineto_mutator,
            read_kineto,
            ".json",
        ),
        Reader(
            "nccl_log", _glob(OWN / "nccl_logs", "*.log"), _bytes_mutator(mutate.mutate_text), read_nccl_log, ".log"
        ),
        Reader(
            "dmon",
            lambda: [*sorted(SIDE.glob("dmon_*.txt")), OWN / "h200x4" / "p2p_nsys" / "dmon.txt"],
            _bytes_mutator(mutate.mutate_text),
            _side_reader("dmon"),
            ".txt",
        ),
        Reader(
            "topo",
            lambda: [*sorted(SIDE.glob("topo_*.txt")), OWN / "h200" / "topo.txt"],
            _bytes_mutator(mutate.mutate_text),
            _side_reader("topo"),
            ".txt",
        ),
        Reader(
            "smi_q",
            _fixed([OWN / "h200" / "nvidia-smi-q.txt", OWN / "h200x4" / "nvidia-smi-q.txt"]),
            _bytes_mutator(mutate.mutate_text),
            _side_reader("smi_q"),
            ".txt",
        ),
        Reader(
            "nccl_tests",
            _glob(SIDE, "nccl_tests_*.txt"),
            _bytes_mutator(mutate.mutate_text),
            _side_reader("nccl_tests"),
            ".txt",
        ),
        Reader("bundle", _glob(OWN / "sweep_h200", "*/manifest.json"), _bundle, read_bundle),
        # The intake prefixes the upload's name to these errors (service/intake.py).
        Reader(
            "archive", _archive_kinds, _archive_mutator, read_archive, ".upload", unpack_seed=False, names_file=False
        ),
        Reader(
            "profile",
            _glob(REPO / "profiles", "*.toml"),
            _profile_mutator,
            read_profile,
            ".toml",
        ),
    )
}


# -- running ----------------------------------------------------------------------------------------


class Hang(Exception):
    """One input took longer than the per-input time limit."""


@contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def _raise(_signum: int, _frame: object) -> None:
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@dataclass
class Finding:
    reader: str
    example: int
    seed: str
    mutation: str
    error: str
    trace: str
    path: Path | None = None


@dataclass
class Result:
    reader: str
    examples: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    mutations: Counter[str] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0


def check_one(reader: Reader, path: Path, limit_s: int = 60) -> tuple[str, str, str]:
    """(outcome, error, traceback): outcome is "ok", "input_error" or "crash"."""
    try:
        with time_limit(limit_s):
            reader.read(path)
    except TraceguardError as exc:
        if reader.names_file and path.name not in str(exc):
            return "crash", f"error does not name the file: {type(exc).__name__}: {exc}", ""
        return "input_error", exc.code, ""
    except Exception as exc:  # a finding: anything that is not the project's own error
        return "crash", f"{type(exc).__name__}: {exc}"[:500], traceback.format_exc()
    return "ok", "", ""


def prepared_seeds(reader: Reader, workdir: Path) -> list[Path]:
    """The reader's seeds, gunzipped into ``workdir`` where the mutators want plain bytes."""
    out = []
    for index, seed in enumerate(reader.seeds()):
        if reader.unpack_seed and seed.name.endswith(".gz"):
            plain = workdir / f"seed{index}-{seed.name.removesuffix('.gz')}"
            if not plain.exists():
                plain.write_bytes(_gunzip(seed))
            out.append(plain)
        else:
            out.append(seed)
    return out


def campaign(
    name: str,
    examples: int,
    *,
    seed: int,
    workdir: Path,
    keep: Path | None = None,
    progress: Callable[[Result], None] | None = None,
) -> Result:
    """``examples`` damaged copies of ``name``'s seeds, read one by one (deterministic for ``seed``).

    Crashing inputs are copied to ``keep`` (when given) for triage and the regression corpus.
    """
    reader = READERS[name]
    workdir.mkdir(parents=True, exist_ok=True)
    seeds = prepared_seeds(reader, workdir)
    result = Result(name)
    started = time.monotonic()
    for example in range(examples):
        rng = random.Random(f"{name}:{seed}:{example}")
        source = rng.choice(seeds)
        case = workdir / f"case{reader.suffix}"
        if case.is_dir():
            shutil.rmtree(case)
        elif case.exists():
            case.unlink()
        shutil.rmtree(workdir / "members", ignore_errors=True)
        how = reader.mutator(source, case, rng)
        outcome, error, trace = check_one(reader, case)
        result.examples += 1
        result.outcomes[outcome] += 1
        result.mutations[how.split("+")[0]] += 1
        if outcome == "crash":
            finding = Finding(name, example, source.name, how, error, trace)
            if keep is not None:
                keep.mkdir(parents=True, exist_ok=True)
                saved = keep / f"{name}-{example}{reader.suffix}"
                if case.is_dir():
                    shutil.copytree(case, saved, dirs_exist_ok=True)
                else:
                    shutil.copyfile(case, saved)
                finding.path = saved
            result.findings.append(finding)
        if progress and example % 100 == 99:
            result.seconds = time.monotonic() - started
            progress(result)
    result.seconds = time.monotonic() - started
    return result


def examples_per_reader(default: int) -> int:
    """The budget: ``TRACEGUARD_FUZZ_EXAMPLES`` (the long manual run) or the CI default."""
    return int(os.environ.get("TRACEGUARD_FUZZ_EXAMPLES", default))
