"""Where external tools live: one locator for the CLI's `.nsys-rep` export and the harness.

Standard library only: the harness imports it on GPU machines that have nothing but torch.
"""

from __future__ import annotations

import glob
import os
import shutil
from pathlib import Path

#: Where nsys may live besides PATH: Debian's split package, NVIDIA's installers, and the copy
#: bundled with Nsight Compute on the GPU machines (NSYS.md). Newest version first within a glob.
NSYS_CANDIDATES: tuple[str, ...] = (
    "/usr/lib/nsight-systems/bin/nsys",
    "/usr/lib/nsight-systems/target-linux-x64/nsys",
    "/opt/nvidia/nsight-systems/*/bin/nsys",
    "/opt/nvidia/nsight-systems/*/target-linux-x64/nsys",
    "/usr/local/cuda/bin/nsys",
    "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys",
)
#: QdstrmImporter, which Debian's split package puts where the CLI does not look (NSYS.md).
IMPORTER_CANDIDATES: tuple[str, ...] = (
    "/usr/lib/nsight-systems/host-linux-x64/QdstrmImporter",
    "{nsys_dir}/../host-linux-x64/QdstrmImporter",
    "{nsys_dir}/../linux-desktop-glibc_2_11_3-x64/QdstrmImporter",
)


def find_nsys() -> str | None:
    """nsys from $TRACEGUARD_NSYS, PATH, or the known install locations."""
    if explicit := os.environ.get("TRACEGUARD_NSYS"):
        return explicit if os.access(explicit, os.X_OK) else None
    if found := shutil.which("nsys"):
        return found
    for pattern in NSYS_CANDIDATES:
        for hit in sorted(glob.glob(pattern), reverse=True):
            if os.path.isfile(hit) and os.access(hit, os.X_OK):
                return hit
    return None


def find_importer(nsys: str) -> str | None:
    nsys_dir = str(Path(nsys).resolve().parent)
    for pattern in IMPORTER_CANDIDATES:
        path = Path(pattern.format(nsys_dir=nsys_dir))
        if path.exists():
            return str(path.resolve())
    return None
