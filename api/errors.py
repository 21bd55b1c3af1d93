"""One JSON error shape for every failure: ``{"error": {"code", "message"[, "hint"]}}``.

TraceguardError subclasses map to HTTP statuses here, once; routes just raise. What a client sent
that cannot be used is a 4xx (422 for content, 413 too large, 415 not a kind traceguard reads); 5xx
only for the server's own faults (store down, an analysis that crashed, a bug), with a reference the
operators find in the log next to the traceback, never the traceback itself."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from traceguard.errors import TraceguardError, UnsupportedFormatError
from traceguard.store.blobs import TooLarge

log = logging.getLogger("traceguard.api")


class ApiError(TraceguardError):
    def __init__(
        self, status: int, code: str, message: str, *, hint: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.code = code
        self.headers = headers


def not_found(what: str) -> ApiError:
    return ApiError(404, "not_found", f"{what} not found")


#: Codes of an analysis that broke on the server's side (not the input's fault).
SERVER_FAULTS = {"analysis_crashed", "analysis_error", "out_of_memory", "store_unavailable", "interrupted"}


def status_of(exc: TraceguardError) -> int:
    if isinstance(exc, ApiError):
        return exc.status
    if isinstance(exc, TooLarge):
        return 413
    if isinstance(exc, UnsupportedFormatError):
        return 415
    if exc.code == "analysis_timeout":
        return 504
    if exc.code in SERVER_FAULTS:
        return 500
    return 422  # the input or the request: InputError, ProfileError, NoUsableInputError, ...


def error_body(code: str, message: str, hint: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"code": code, "message": message}
    if hint:
        body["hint"] = hint
    return {"error": body}


#: Routes anyone may call; every other documented route needs ``Authorization: Bearer <token>``.
PUBLIC_PATHS = frozenset({"/healthz", "/readyz"})
#: What every authenticated route may answer besides its own codes, in the one error shape.
_COMMON_ERRORS = {
    "401": "no token, or a token that is unknown, revoked or expired",
    "403": "the token lacks the scope this route needs",
    "422": "a parameter or the body is not valid",
}


def document(spec: dict[str, Any]) -> dict[str, Any]:
    """The OpenAPI document made to say what the handlers do: bearer authentication on every route
    but :data:`PUBLIC_PATHS`, and the error shape on every 4xx/5xx answer (schemathesis checks both)."""
    from api.schemas import ErrorResponse

    components = spec.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    schemas.setdefault("ErrorResponse", ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}"))
    for name, sub in schemas["ErrorResponse"].pop("$defs", {}).items():
        schemas.setdefault(name, sub)
    components.setdefault("securitySchemes", {})["bearer"] = {
        "type": "http",
        "scheme": "bearer",
        "description": "a project token (`traceguard token create`), as `Authorization: Bearer <token>`",
    }
    error_content = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
    for path, operations in spec.get("paths", {}).items():
        for operation in operations.values():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            responses = operation["responses"]
            if path not in PUBLIC_PATHS:
                operation["security"] = [{"bearer": []}]
                for status, description in _COMMON_ERRORS.items():
                    responses.setdefault(status, {"description": description})
            if "{" in path:  # an id in the path may name nothing (in this project)
                responses.setdefault("404", {"description": "nothing with that id in this project"})
            if "requestBody" in operation:
                responses.setdefault("400", {"description": "the body cannot be parsed (not JSON, broken multipart)"})
            for status, response in responses.items():
                # FastAPI documents its own 422 body ({"detail": [...]}); ours is the one error shape.
                generated = "HTTPValidationError" in str(response.get("content", ""))
                if status[:1] in ("4", "5") and (generated or not response.get("content")):
                    response["content"] = error_content
    return spec


def install(app: FastAPI) -> None:
    original_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document(original_openapi())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(TraceguardError)
    async def _traceguard(_request: Request, exc: TraceguardError) -> JSONResponse:
        return JSONResponse(exc.to_dict(), status_code=status_of(exc), headers=getattr(exc, "headers", None))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized", 403: "forbidden"}.get(
            exc.status_code, "http_error"
        )
        return JSONResponse(error_body(code, str(exc.detail)), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'request'}: {e.get('msg')}"
            for e in exc.errors()[:5]
        )
        return JSONResponse(error_body("invalid_request", problems), status_code=422)

    @app.exception_handler(ClientDisconnect)
    async def _gone(_request: Request, _exc: ClientDisconnect) -> JSONResponse:
        # The uploader hung up mid-body (what was received is already discarded): nobody reads this.
        return JSONResponse(error_body("client_disconnected", "the client closed the connection"), status_code=400)

    @app.exception_handler(OverflowError)
    @app.exception_handler(DataError)
    async def _out_of_range(_request: Request, exc: Exception) -> JSONResponse:
        # An id or count the database cannot hold (SQLite: beyond 64 bits; PostgreSQL: beyond the
        # column's integer type) names nothing that exists: the request's fault, not the server's.
        message = "a number in the request is out of range for this service (ids and counts are 32-bit)"
        return JSONResponse(error_body("invalid_request", message), status_code=422)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        reference = uuid.uuid4().hex[:12]
        log.error("internal error %s on %s %s", reference, request.method, request.url.path, exc_info=exc)
        message = f"internal error (a bug in traceguard); the server log has it under reference {reference}"
        return JSONResponse(error_body("internal_error", message), status_code=500)
