"""HTTP client of the traceguard service, for ``traceguard upload`` (a CI profiling job's gate).

Files stream from disk in chunks (never read whole); every call raises ServiceError with the
service's own error code and message.
"""

from __future__ import annotations

import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from traceguard.errors import TraceguardError

CHUNK = 1 << 20


def pack_bundle(directory: Path, scratch: Path) -> Path:
    """The regular files directly in ``directory`` as ``<scratch>/<name>.tar`` (uncompressed:
    captures are gzipped already). Links and subdirectories are left out."""
    target = scratch / f"{directory.resolve().name or 'bundle'}.tar"
    with tarfile.open(target, "w") as tar:
        for path in sorted(directory.iterdir()):
            if path.is_file() and not path.is_symlink():
                tar.add(path, arcname=path.name, recursive=False)
    return target


class ServiceError(TraceguardError):
    """The service refused or failed a request; ``status`` is the HTTP status (0: unreachable)."""

    exit_code = 2

    def __init__(self, status: int, code: str, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.code = code


def _raise_for(response: httpx.Response) -> None:
    if response.is_success:
        return
    try:
        error = response.json()["error"]
        raise ServiceError(
            response.status_code, error.get("code", "error"), error.get("message", ""), error.get("hint")
        )
    except (ValueError, KeyError, TypeError):
        raise ServiceError(response.status_code, "http_error", response.text[:500] or response.reason_phrase) from None


@dataclass
class Client:
    server: str
    token: str
    timeout: float = 600.0

    def __post_init__(self) -> None:
        self._http = httpx.Client(
            base_url=self.server.rstrip("/"),
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=httpx.Timeout(self.timeout, connect=10.0),
        )

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, url, **kwargs)
        except httpx.TransportError as exc:
            raise ServiceError(0, "unreachable", f"cannot reach {self.server}: {exc}") from exc
        _raise_for(response)
        return response

    def create_run(
        self, *, name: str, labels: dict[str, str], profile: str, step_patterns: list[str] | None = None
    ) -> dict[str, Any]:
        body = {"name": name, "labels": labels, "profile": profile, "step_patterns": list(step_patterns or [])}
        return self._call("POST", "/v1/runs", json=body).json()

    def upload(
        self,
        run_id: int,
        path: Path,
        *,
        rank: int | None = None,
        analyze: bool = False,
        on_bytes: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        """Stream one file as the request body (``application/octet-stream``)."""

        def body() -> Iterator[bytes]:
            with path.open("rb") as fh:
                while chunk := fh.read(CHUNK):
                    if on_bytes:
                        on_bytes(len(chunk))
                    yield chunk

        params: dict[str, Any] = {"name": path.name, "analyze": str(analyze).lower()}
        if rank is not None:
            params["rank"] = rank
        return self._call(
            "POST",
            f"/v1/runs/{run_id}/files",
            params=params,
            content=body(),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(path.stat().st_size)},
        ).json()

    def analyze(self, run_id: int, profile: str | None = None) -> dict[str, Any]:
        params = {"profile": profile} if profile else {}
        return self._call("POST", f"/v1/runs/{run_id}/analyze", params=params).json()["job"]

    def job(self, job_id: int) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{job_id}").json()

    def wait(
        self,
        job_id: int,
        *,
        timeout: float,
        poll: float = 1.0,
        on_update: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """Poll the job until it ends; ``on_update`` sees each state (status, ``ranks_done`` of ``ranks_total``)."""
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(job_id)
            if on_update:
                on_update(job)
            if job["status"] in ("succeeded", "failed"):
                return job
            if time.monotonic() > deadline:
                raise ServiceError(0, "wait_timeout", f"job {job_id} is still {job['status']} after {timeout:.0f} s")
            time.sleep(poll)

    def report(self, run_id: int, profile: str | None = None, fmt: str = "json") -> httpx.Response:
        params = {"format": fmt, **({"profile": profile} if profile else {})}
        return self._call("GET", f"/v1/runs/{run_id}/report", params=params)

    def newest_run(self, labels: dict[str, str], *, exclude: int | None = None) -> dict[str, Any] | None:
        """The newest analysed run carrying every label (other than ``exclude``), or None."""
        params = {"label": [f"{k}:{v}" for k, v in labels.items()], "status": "analysed", "limit": 2}
        runs = self._call("GET", "/v1/runs", params=params).json()["runs"]
        return next((r for r in runs if r["id"] != exclude), None)

    def compare(self, base: int, head: int) -> dict[str, Any]:
        return self._call("GET", "/v1/compare", params={"base": base, "head": head}).json()

    def runs(
        self,
        *,
        labels: dict[str, str] | None = None,
        status: str | None = None,
        created_after: str | None = None,
        created_before: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """One page of ``GET /v1/runs`` (newest first): ``{"runs": [...], "next_cursor": ...}``."""
        params: dict[str, Any] = {"label": [f"{k}:{v}" for k, v in (labels or {}).items()], "limit": limit}
        for key, value in (
            ("status", status),
            ("created_after", created_after),
            ("created_before", created_before),
            ("cursor", cursor),
        ):
            if value is not None:
                params[key] = value
        return self._call("GET", "/v1/runs", params=params).json()

    def steps(
        self,
        run_id: int,
        *,
        rank: int | None = None,
        phase: str | None = None,
        collective: str | None = None,
        limit: int = 1000,
        offset: int = 0,
    ) -> list[dict[str, Any]]:
        """``GET /v1/runs/{id}/steps``: step rows with their phases and collectives by type."""
        params: dict[str, Any] = {"limit": limit, "offset": offset}
        for key, value in (("rank", rank), ("phase", phase), ("collective", collective)):
            if value is not None:
                params[key] = value
        return self._call("GET", f"/v1/runs/{run_id}/steps", params=params).json()["steps"]
