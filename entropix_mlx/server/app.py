"""The HTTP layer: Starlette routes for the OpenAI-compatible API and the page.

Handlers validate a request (schema.py), encode its prompt, build its sampler
and queue a `Job` for the engine's worker thread; then they relay the worker's
events, as server-sent events (`stream: true`) or as one JSON response. A
client that goes away cancels its job: the worker stops at the next token.
"""

import asyncio
import contextlib
import hmac
import json
import time
from importlib import resources

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..decode.tools import call_grammar, marker_tokens
from ..errors import ConfigError, ContextOverflowError
from ..front import SAMPLER_NAMES, choose, deterministic, seeded_strategies
from ..sampling.config import THRESHOLDS, resolve_config
from ..sampling.constraint import SchemaError
from .engine import Engine, Job, random_seed
from .responses import Answer
from .schema import APIError, bad, config_error, in_schema, parse
from .strategies import page_info
from .transport import MAX_BODY, error_response, read_body, relay, sse, whole_response

STATIC = resources.files("entropix_mlx.server") / "static"


class Server:
    """`strict_model`: a request naming another model than the served one (or
    one of `aliases`) is refused; otherwise the one model answers whatever name
    the request gives, as llama.cpp's and Ollama's single-model servers do
    (front-ends often send a fixed name such as "gpt-4")."""

    def __init__(
        self,
        engine: Engine,
        api_key: str | None = None,
        max_body: int = MAX_BODY,
        strict_model: bool = False,
        aliases: tuple[str, ...] = (),
    ):
        self.engine, self.api_key, self.max_body = engine, api_key, max_body
        self.strict_model, self.aliases = strict_model, tuple(aliases)

    # -- preparing a job -------------------------------------------------

    def _check_model(self, model: str | None):
        # The field is a name to match, never something to load: the served model answers.
        if self.strict_model and model is not None and model not in (self.engine.name, *self.aliases):
            raise APIError(
                404,
                f"the model '{model}' does not exist; this server serves '{self.engine.name}'",
                "model",
                code="model_not_found",
            )

    def _prepare(self, p, chat: bool) -> tuple[list[Job], list[str]]:
        """Runs in a worker thread of Starlette's pool (tokenizing takes time). One
        job per choice (seeds seed, seed + 1, ...), sharing one prefill of the
        prompt; one job for a sampler whose candidates are the choices (deliberate)."""
        engine, loaded = self.engine, self.engine.loaded
        with engine.tokenizer_lock:
            try:
                ids = loaded.encode(p.messages, tools=p.tools) if chat else loaded.encode(text=p.prompt)
            except ConfigError as e:  # no chat template
                raise APIError(400, f"{e}; use /v1/completions", "messages") from None
            # Front-ends send temperature and the like on every request: samplers
            # that take none leave them out (with a note) rather than refuse the request.
            choice = choose(p.sampler, p.overrides, SAMPLER_NAMES)
            warnings = list(choice.notes)
            try:
                reasoning = choice.reasons(p.reasoning)
            except ConfigError as e:
                raise bad("reasoning", str(e)) from None
            seed = p.seed if p.seed is not None else random_seed()
            rows = 1 if choice.spec.whole_answers else p.n
            # A call required, or one tool named: the answer is that call, its arguments the tool's.
            named = None if p.tool_call == "required" else p.tool_call
            grammar = call_grammar(p.tools, named, marker_tokens(engine.tokenizer)) if p.tool_call else None
            # Every sampler, greedy and deliberate included: penalties change the logits, not the sampling.
            try:
                prepared = [
                    loaded.prepare(
                        ids,
                        choice,
                        p.max_tokens,
                        (seed + i) % 2**63,
                        p.penalties,
                        reasoning=reasoning,
                        json_schema=p.json_schema,
                        grammar=grammar,
                        path_choice=i,
                    )
                    for i in range(rows)
                ]
            except ContextOverflowError as e:
                where = "messages" if chat else "prompt"
                raise APIError(400, str(e), where, code="context_length_exceeded") from None
            except SchemaError as e:
                where = "tools" if grammar else in_schema("response_format.json_schema.schema", e.path)
                raise APIError(400, str(e), where, code="unsupported_schema") from None
            except ConfigError as e:
                raise config_error(str(e), p.overrides) from None
        if rows > 1 and deterministic(prepared[0].sampler):
            warnings.append(f"the {choice.name} sampler never samples: its {rows} choices are the same answer")
        if prepared[0].clamped:
            warnings.append(
                f"max_tokens {p.max_tokens} clamped to {prepared[0].room}: the prompt's {len(ids)} tokens "
                f"leave that much of the {engine.context}-token context"
            )
        recipe = {"sampler": choice.name, "overrides": choice.params, "penalties": p.penalties, "reasoning": reasoning}
        if p.json_schema is not None:
            recipe["json_schema"] = p.json_schema
        if grammar is not None:
            recipe["grammar"] = grammar
        jobs = [
            Job(
                ids,
                one.sampler,
                one.max_tokens,
                one.seed,
                p.logprobs,
                p.top_logprobs,
                p.stop,
                one.penalties,
                recipe=recipe,
                shared_prefill=rows > 1,
            )
            for one in prepared
        ]
        return jobs, warnings

    # -- endpoints -------------------------------------------------------

    async def chat(self, request: Request):
        return await self._complete(request, chat=True)

    async def completions(self, request: Request):
        return await self._complete(request, chat=False)

    async def _complete(self, request: Request, chat: bool):
        try:
            raw = await read_body(request, self.max_body)
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise APIError(400, f"the request body is not valid JSON ({e})", None, code="invalid_json") from None
            p = parse(body, chat, SAMPLER_NAMES)
            self._check_model(p.model)
            jobs, warnings = await run_in_threadpool(self._prepare, p, chat)
        except APIError as e:
            return error_response(e)
        kind = "chat" if chat else "completion"
        answers = [Answer(kind, self.engine.name, job.seed, warnings, index=i) for i, job in enumerate(jobs)]
        for answer, job in zip(answers, jobs, strict=True):
            answer.structured = p.json_schema is not None
            answer.tools = tuple(t["function"]["name"] for t in p.tools or ())
            answer.no_calls, answer.sure_at = p.no_calls, p.sure_at
            answer.seeded = seeded_strategies(job.sampler, self.engine.loaded.model.args.vocab_size)
        events = relay(jobs, [self.engine.submit(job) for job in jobs])
        headers = {"X-Entropix-Warning": " ".join(warnings)} if warnings else {}
        if p.stream:
            return StreamingResponse(
                self._stream(jobs, answers, events, p),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers},
            )
        try:
            await self._collect(request, answers, events, p.n)
        except APIError as e:
            return error_response(e)
        finally:
            for job in jobs:
                job.cancelled = True  # the job is over; if the client left, this stops it
        if any(a.finish_reason is None for a in answers):  # the client disconnected; nobody reads this
            return JSONResponse({}, status_code=499)
        return whole_response(answers[0].whole(p.logprobs, answers[1:]))

    async def _next(self, request: Request | None, events: asyncio.Queue):
        """The workers' next (choice, event); None when the client has gone
        (non-streamed requests poll for it: nothing else would notice before the
        answer ends)."""
        while True:
            try:
                return await asyncio.wait_for(events.get(), timeout=0.5)
            except TimeoutError:
                if request is not None and await request.is_disconnected():
                    return None

    def _apply(self, answer: Answer, event) -> tuple[str, list, list | None] | None:
        """Fold one worker event into the answer; returns what a chunk would carry."""
        kind = event[0]
        if kind == "start":
            answer.prompt_tokens, answer.cached_tokens = event[1]["prompt_tokens"], event[1]["cached_tokens"]
            return None
        if kind == "token":
            _, rec, entry, text = event
            answer.text += text
            answer.records.append(rec)
            answer.completion_tokens += 1
            if entry is not None:
                answer.logprobs.append(entry)
            return text, [rec], [entry] if entry is not None else None
        if kind == "end":
            answer.end(*event[1:], self.engine.loaded)
            return event[2], [], None
        raise APIError(500, event[1], None, type="server_error", code="generation_failed")

    def _candidates(self, answers: list, event, n: int) -> None:
        """Deliberate asked for n choices: its other candidates join `answers`."""
        deliberation = getattr(event[3], "deliberation", None) if event[0] == "end" else None
        if n > 1 and len(answers) == 1 and deliberation is not None:
            with self.engine.tokenizer_lock:
                answers += answers[0].candidates(deliberation, self.engine.tokenizer, n)

    async def _collect(self, request, answers: list, events, n: int):
        while any(a.finish_reason is None for a in answers):
            got = await self._next(request, events)
            if got is None:
                return
            index, event = got
            self._apply(answers[index], event)
            self._candidates(answers, event, n)

    async def _stream(self, jobs: list, answers: list, events, p):
        # Starlette closes this generator when the client disconnects; `finally` then cancels the jobs.
        try:
            if answers[0].kind == "chat":
                for answer in answers:
                    yield sse(answer.first_chunk())
            pending = [("", [], []) for _ in answers]
            while any(a.finish_reason is None for a in answers):
                try:
                    index, event = await self._next(None, events)
                    answer = answers[index]
                    out = self._apply(answer, event)
                except APIError as e:
                    yield sse(e.body())
                    break
                if out is None:
                    continue
                text, records, entries = (
                    x + y for x, y in zip(pending[index], (out[0], out[1], out[2] or []), strict=True)
                )
                if answer.reads_calls:  # a tool call's text is never streamed as content
                    text = answer.content_delta()
                # Text held back (a possible stop string, an unfinished UTF-8
                # character) travels with the token that completes it.
                pending[index] = ("", [], [])
                if text or answer.finish_reason is not None:
                    last = answer.finish_reason is not None
                    yield sse(
                        answer.chunk(
                            text, records, entries if p.logprobs else None, answer.finish_reason if last else None
                        )
                    )
                else:
                    pending[index] = (text, records, entries)
                before = len(answers)
                self._candidates(answers, event, p.n)
                for other in answers[before:]:  # deliberate's other candidates, whole
                    yield sse(other.chunk(other.text, [], None, other.finish_reason))
            if p.include_usage and all(a.finish_reason is not None for a in answers):
                usage = answers[0].whole(False, answers[1:])["usage"]
                chunk = answers[0].usage_chunk()
                chunk["usage"] = usage
                yield sse(chunk)
            yield "data: [DONE]\n\n"
        finally:
            for job in jobs:
                job.cancelled = True

    async def models(self, request: Request):
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": name, "object": "model", "created": int(time.time()), "owned_by": "entropix-mlx"}
                    for name in (self.engine.name, *self.aliases)
                ],
                # What a request's "model" may name: these, or any name (the one model answers).
                "entropix": {"serves": self.engine.name, "any_name": not self.strict_model},
            }
        )

    async def health(self, request: Request):
        return JSONResponse(
            {
                "status": "ok",
                "model": self.engine.name,
                "busy": self.engine.busy,
                "waiting": self.engine.waiting,
                "served": self.engine.served,
                "cancelled": self.engine.cancelled,
                "prefix_cache": {"entries": len(self.engine.prefix_cache), "tokens": self.engine.prefix_cache.tokens},
            }
        )

    async def info(self, request: Request):
        """What the page needs: samplers, strategy colours, the card's thresholds."""
        cfg, source = resolve_config(self.engine.loaded.card.ref)
        return JSONResponse(
            {
                "model": self.engine.name,
                "context": self.engine.context,
                "samplers": list(SAMPLER_NAMES),
                **page_info(SAMPLER_NAMES, cfg, getattr(getattr(self.engine.model, "args", None), "vocab_size", None)),
                "thresholds": {k: getattr(cfg, k) for k in THRESHOLDS},
                "thresholds_from": source,
            }
        )

    async def page(self, request: Request):
        return FileResponse(str(STATIC / "index.html"))


class _Auth:
    """`Authorization: Bearer KEY` on every /v1/ route (the page and /health stay open:
    they hold no model output; the page asks for the key and sends it)."""

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].startswith("/v1/") and scope["method"] != "OPTIONS":
            header = dict(scope["headers"]).get(b"authorization", b"")
            scheme, _, token = header.partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self.key):
                e = APIError(
                    401, "missing or wrong API key: send 'Authorization: Bearer KEY'", None, code="invalid_api_key"
                )
                await error_response(e)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    engine: Engine,
    api_key: str | None = None,
    allow_origins: list[str] | None = None,
    max_body: int = MAX_BODY,
    strict_model: bool = False,
    aliases: tuple[str, ...] = (),
) -> Starlette:
    server = Server(engine, api_key, max_body, strict_model, aliases)
    routes = [
        Route("/", server.page),
        Route("/health", server.health),
        Route("/v1/models", server.models),
        Route("/v1/entropix/info", server.info),
        Route("/v1/chat/completions", server.chat, methods=["POST"]),
        Route("/v1/completions", server.completions, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(STATIC)), name="static"),
    ]
    middleware = []
    if allow_origins:  # off unless asked for: a page elsewhere must not drive a local model
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=allow_origins,
                allow_methods=["GET", "POST"],
                allow_headers=["Authorization", "Content-Type"],
            )
        )
    if api_key:
        middleware.append(Middleware(_Auth, key=api_key))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        engine.close()

    async def http_error(request, exc: HTTPException):
        # An unknown path or a wrong method: OpenAI's error object too, not Starlette's plain text.
        return error_response(
            APIError(
                exc.status_code,
                f"{request.method} {request.url.path}: {exc.detail}",
                None,
                code="not_found" if exc.status_code == 404 else "method_not_allowed",
            )
        )

    app = Starlette(
        routes=routes, middleware=middleware, lifespan=lifespan, exception_handlers={HTTPException: http_error}
    )
    app.state.server = server
    return app
