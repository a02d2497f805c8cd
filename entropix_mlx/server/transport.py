"""What travels between the HTTP layer and the engine's worker: request bodies
read within a limit, error objects, server-sent events, and the events of a
request's several jobs (one per choice) merged into one queue."""

import asyncio
import json

from starlette.requests import Request
from starlette.responses import JSONResponse

from .schema import APIError

MAX_BODY = 1_000_000  # bytes; a long chat history is far below this


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it passes `limit` (whether or not
    the client sent a Content-Length), so an oversized upload is never buffered."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise APIError(413, f"the request body is {length} bytes; the limit is {limit}", None, code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"the request body is over the limit of {limit} bytes", None, code="request_too_large")
        chunks.append(chunk)
    return b"".join(chunks)


def whole_response(body: dict) -> JSONResponse:
    """A whole answer, its warnings also in the X-Entropix-Warning header."""
    headers = {"X-Entropix-Warning": " ".join(body["warnings"])} if body["warnings"] else {}
    return JSONResponse(body, headers=headers)


def relay(jobs: list, submitted: list) -> asyncio.Queue:
    """One queue of (choice index, event) for the events of all a request's jobs."""
    merged: asyncio.Queue = asyncio.Queue()

    async def forward(index: int, job):
        while True:
            event = await job.events.get()
            await merged.put((index, event))
            if event[0] in ("end", "error"):
                return

    for index, job in enumerate(submitted):
        asyncio.get_running_loop().create_task(forward(index, job))
    return merged


def sse(data) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False, allow_nan=False)}\n\n"
