"""Request bodies streamed to disk in chunks, never whole in memory.

``multipart/form-data``: every file part goes to its own blob writer (hashed and size-checked as
it streams); small text fields (``rank``) before a file part apply to it. Any other content type
is one raw file (``application/octet-stream``, name from ``?name=``). Parsing runs in a worker
thread per chunk, so the event loop only moves bytes.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Request
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from api.errors import ApiError
from traceguard.errors import InputError
from traceguard.store.blobs import BlobStore, BlobWriter, TooLarge

MAX_FIELD_BYTES = 1024
#: After a limit is hit, up to this much of the rest of the body is read and dropped so that the
#: client receives the 413 answer instead of a broken connection; beyond it the connection closes.
DRAIN_BYTES = 64 << 20


@dataclass
class ReceivedFile:
    name: str
    rank: int | None
    writer: BlobWriter


@dataclass
class Received:
    files: list[ReceivedFile] = field(default_factory=list)
    fields: dict[str, str] = field(default_factory=dict)

    def discard(self) -> None:
        for f in self.files:
            f.writer.discard()


def parse_rank(text: str | None) -> int | None:
    if text is None or text.strip() == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise InputError(f"rank must be a whole number, not {text!r}") from None
    if not 0 <= value < 1 << 20:
        raise InputError(f"rank {value} is out of range")
    return value


class _MultipartSink:
    def __init__(self, blobs: BlobStore, boundary: bytes, file_limit: int, default_rank: int | None) -> None:
        self.blobs = blobs
        self.file_limit = file_limit
        self.default_rank = default_rank
        self.received = Received()
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._headers: dict[str, bytes] = {}
        self._field_name: str | None = None
        self._field_value = bytearray()
        self._file: BlobWriter | None = None
        self.parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._part_begin,
                "on_header_field": lambda d, s, e: self._header_field.extend(d[s:e]),
                "on_header_value": lambda d, s, e: self._header_value.extend(d[s:e]),
                "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished,
                "on_part_data": self._part_data,
                "on_part_end": self._part_end,
            },
        )

    def _part_begin(self) -> None:
        self._headers = {}
        self._field_name, self._file = None, None
        self._field_value = bytearray()

    def _header_end(self) -> None:
        self._headers[bytes(self._header_field).decode("latin-1").lower()] = bytes(self._header_value)
        self._header_field, self._header_value = bytearray(), bytearray()

    def _headers_finished(self) -> None:
        disposition, params = parse_options_header(self._headers.get("content-disposition", b""))
        if disposition != b"form-data" or b"name" not in params:
            raise InputError("a multipart part has no 'Content-Disposition: form-data; name=...' header")
        name = params[b"name"].decode("utf-8", errors="replace")
        if b"filename" in params:
            filename = params[b"filename"].decode("utf-8", errors="replace") or "upload"
            writer = self.blobs.writer(limit=self.file_limit, what=f"file {filename!r}")
            rank = parse_rank(self.received.fields.get("rank")) if "rank" in self.received.fields else self.default_rank
            self.received.files.append(ReceivedFile(filename, rank, writer))
            self._file = writer
        else:
            self._field_name = name

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._file is not None:
            self._file.write(data[start:end])
        else:
            self._field_value.extend(data[start:end])
            if len(self._field_value) > MAX_FIELD_BYTES:
                raise InputError(f"form field {self._field_name!r} is longer than {MAX_FIELD_BYTES} bytes")

    def _part_end(self) -> None:
        if self._file is not None:
            self._file.finish()
        elif self._field_name is not None:
            self.received.fields[self._field_name] = self._field_value.decode("utf-8", errors="replace")


class _Body:
    """The request body as chunks, remembering whether its end was seen (so a refusal can drain
    the rest without waiting for bytes that will never come)."""

    def __init__(self, request: Request, limit: int) -> None:
        self._receive = request.receive
        self.limit = limit
        self.ended = False
        self.size = 0

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's chunks; TooLarge as soon as they add up to more than ``limit`` bytes."""
        while not self.ended:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                raise ClientDisconnect()
            self.ended = not message.get("more_body", False)
            if body := message.get("body", b""):
                self.size += len(body)
                if self.size > self.limit:
                    raise TooLarge(f"the request is larger than the limit of {self.limit} bytes", self.limit)
                yield body

    async def drain(self) -> None:
        self.limit = self.size + DRAIN_BYTES
        with contextlib.suppress(TooLarge):
            async for _ in self.chunks():
                pass


async def receive_upload(
    request: Request, blobs: BlobStore, *, file_limit: int, request_limit: int, name: str | None, rank: int | None
) -> Received:
    """Stream the body into blob writers; raises TooLarge (413) or InputError (422)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > request_limit:
        raise TooLarge(
            f"the request declares {int(declared)} bytes, more than the limit of {request_limit} bytes "
            f"({request_limit / (1 << 20):.0f} MiB)",
            request_limit,
        )
    content_type, params = parse_options_header(request.headers.get("content-type", ""))
    body = _Body(request, request_limit)
    if content_type == b"multipart/form-data":
        boundary = params.get(b"boundary")
        if not boundary:
            raise ApiError(400, "invalid_request", "multipart/form-data without a boundary")
        sink = _MultipartSink(blobs, boundary, file_limit, rank)
        try:
            async for chunk in body.chunks():
                await run_in_threadpool(sink.parser.write, chunk)
            await run_in_threadpool(sink.parser.finalize)
        except (TooLarge, InputError):
            sink.received.discard()
            await body.drain()
            raise
        except ClientDisconnect:
            sink.received.discard()
            raise
        except ValueError as exc:  # the multipart parser's own complaints
            sink.received.discard()
            raise InputError(f"the multipart body is malformed ({exc})") from exc
        if not sink.received.files:
            raise InputError("the multipart body has no file part (a part with a filename)")
        return sink.received
    if content_type in (b"application/x-www-form-urlencoded", b"text/plain") and not name:
        raise ApiError(
            415,
            "unsupported_media_type",
            "upload files as multipart/form-data, or as application/octet-stream with ?name=FILE",
        )
    writer = blobs.writer(limit=file_limit, what=f"file {name or 'upload'!r}")
    try:
        async for chunk in body.chunks():
            await run_in_threadpool(writer.write, chunk)
        if body.size == 0:
            raise InputError("the request body is empty")
        writer.finish()
    except (TooLarge, InputError):
        writer.discard()
        await body.drain()
        raise
    except ClientDisconnect:
        writer.discard()
        raise
    return Received(files=[ReceivedFile(name or "upload", rank, writer)])
