"""`entropix-mlx run PROMPT`: one answer, streamed, each token coloured by the
strategy that chose it.

stdout carries the answer only (or, with --json, only JSON Lines); the header,
legend and summary go to stderr, so `run ... > answer.txt` keeps just the text.
"""

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from entropix_mlx.accel.weights import default_weights
from entropix_mlx.decode.events import plain
from entropix_mlx.decode.fields import json_fields
from entropix_mlx.distributed import world
from entropix_mlx.errors import ConfigError, ContextOverflowError
from entropix_mlx.files import write_atomic
from entropix_mlx.front import DEFAULT_SAMPLER, choose, deterministic, encode_prompt
from entropix_mlx.front.registry import sampler_legend
from entropix_mlx.sampling.answers import looks_like_chain_of_thought

from . import render
from .deliberation import deliberation_progress, deliberation_table
from .loaded import every_seed_gives, header, quiet_unless_root, silence_stdout
from .options import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_SEED,
    BudgetOpt,
    ConfigOpt,
    FrequencyPenaltyOpt,
    JsonSchemaOpt,
    MaxTokensOpt,
    MinPOpt,
    ModelOpt,
    NoCacheOpt,
    NoColorOpt,
    PresencePenaltyOpt,
    ReasoningOpt,
    RepetitionPenaltyOpt,
    SamplerOpt,
    SeedOpt,
    SureAtOpt,
    SystemOpt,
    TemperatureOpt,
    TopKOpt,
    TopPOpt,
    VerboseOpt,
    WeightsOpt,
    check_config,
    check_options,
    reasoning_hint,
)
from .signals import deferred, exit_code


def read_prompt(prompt: str) -> str:
    """The prompt text; '-' reads standard input, which must be UTF-8 text."""
    if prompt == "-":
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode()
        try:
            prompt = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"standard input is not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
                "convert it first, e.g. iconv -f latin1 -t utf-8"
            ) from None
        prompt = prompt.removeprefix("\ufeff").rstrip("\r\n")  # a BOM and the final newline are not the prompt
        if "\x00" in prompt:
            raise ConfigError("standard input contains NUL bytes, so it is binary data, not a prompt; pass text")
    if not prompt.strip():
        raise ConfigError("the prompt is empty; pass some text, or '-' to read it from standard input")
    return prompt


def prompt_tokens(tokenizer, prompt: str, system: str | None, raw: bool) -> list[int]:
    """--raw: the text as is, control tokens written in it parsed. Otherwise the
    chat template, with `<|im_end|>` and the like in the user's text kept as text."""
    if raw:
        return encode_prompt(tokenizer, text=prompt)
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
    try:
        return encode_prompt(tokenizer, messages)
    except ConfigError:  # no chat template
        raise ConfigError("this model has no chat template; use --raw to send the prompt as is") from None


def json_line(record: dict) -> str:
    return json.dumps(plain(record), allow_nan=False) + "\n"


def run(
    ctx: typer.Context,
    prompt: Annotated[str, typer.Argument(metavar="PROMPT", help="The prompt; '-' reads it from standard input.")],
    model: ModelOpt = None,
    sampler: SamplerOpt = DEFAULT_SAMPLER,
    max_tokens: MaxTokensOpt = DEFAULT_MAX_TOKENS,
    seed: SeedOpt = DEFAULT_SEED,
    system: SystemOpt = None,
    config: ConfigOpt = None,
    temperature: TemperatureOpt = None,
    top_p: TopPOpt = None,
    top_k: TopKOpt = None,
    min_p: MinPOpt = None,
    repetition_penalty: RepetitionPenaltyOpt = None,
    presence_penalty: PresencePenaltyOpt = None,
    frequency_penalty: FrequencyPenaltyOpt = None,
    raw: Annotated[bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")] = False,
    json_lines: Annotated[
        bool, typer.Option("--json", help='JSON Lines on stdout: one object per token, then {"summary": ...}.')
    ] = False,
    no_color: NoColorOpt = False,
    weights: WeightsOpt = default_weights(),
    no_cache: NoCacheOpt = False,
    html: Annotated[
        Path | None,
        typer.Option("--html", help="Also write the answer as a self-contained HTML page (the server page's export)."),
    ] = None,
    budget: BudgetOpt = None,
    reasoning: ReasoningOpt = False,
    json_schema: JsonSchemaOpt = None,
    verbose: VerboseOpt = False,
    sure_at: SureAtOpt = None,
):
    """Answer PROMPT, streaming each token in the colour of the strategy that chose it."""
    params = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p}
    check_options(sampler, config, model, budget, reasoning, **params)
    choice = choose(sampler, params)  # temperature 0: greedy answers
    check_config(choice, config, model, budget, reasoning)
    _check_run_options(choice, html, raw, system)
    schema = read_schema(json_schema)
    text = read_prompt(prompt)
    loaded = ctx.obj.load(model, weights, tensor_parallel=True, card=choice.spec.reads_card, cache=not no_cache)
    llm, tokenizer, source = loaded.model, loaded.tokenizer, loaded.source  # under mlx.launch: sharded
    w = world()
    quiet_unless_root(w)
    ids = prompt_tokens(tokenizer, text, system, raw)
    penalties = dict(presence=presence_penalty, frequency=frequency_penalty, repetition=repetition_penalty)
    settings = {"budget": budget} if choice.spec.budget else {}
    prepared = loaded.prepare(ids, choice, max_tokens, seed, penalties, config, reasoning, schema, **settings)
    chooser = prepared.sampler
    recorder = None
    if html is not None:  # records each token's top alternatives for the page's hover details
        # the server package only for --html: app.py imports this module at each start
        from entropix_mlx.server.export import AnswerRecorder

        recorder = AnswerRecorder(chooser, tokenizer)
        prepared.sampler = recorder.sampler  # (the header names the sampler it wraps, and its card)
    out, err, color = consoles(no_color, w.root)
    for note in prepared.notes:
        err.print(f"note: {note}", style=render.META_STYLE)
    if prepared.clamped:  # stop at the end of the context rather than overflow it mid-answer
        err.print(
            f"warning: --max-tokens {max_tokens} is more than the context leaves after the prompt; "
            f"the answer stops after {prepared.room} tokens",
            style=render.META_STYLE,
        )
    generation = loaded.generate(prepared)

    def show(event):
        if recorder is not None:
            recorder.add(event)
        if json_lines:
            sys.stdout.write(json_line(event.to_dict()))
            sys.stdout.flush()
        else:
            render.write_token(out, event.text, event.strategy, color)

    def begin():
        if not json_lines:
            err.print(header(source, chooser, seed, llm, verbose), style=render.META_STYLE)
            if color:
                err.print(render.legend(sampler_legend(chooser, llm.args.vocab_size)))
            if hasattr(generation, "on_row"):  # deliberate: show the branches as they finish
                generation.on_row = deliberation_progress(err, tokenizer, color)

    def extra(summary) -> dict:
        # The answer is every seed's when the sampler never samples or drew none of its tokens.
        every_seed = deterministic(chooser) or every_seed_gives(chooser, summary)
        records = [e.to_dict() for e in generation.events]
        confidence = loaded.confidence(records, summary.finish_reason, sure_at)
        more = {"deterministic": every_seed, "confidence": confidence}
        return more | ({"fields": answer_fields(generation)} if schema is not None else {})

    code, summary = stream(generation, begin, show, json_lines, out, prepared.clamped, extra)
    every_seed = every_seed_gives(chooser, summary)
    if not json_lines:
        confidence = extra(summary)["confidence"]
        print_end(err, summary, generation if schema is not None else None, color, every_seed, confidence)
        answer = "".join(e.text for e in generation.events)
        if not reasoning and looks_like_chain_of_thought(f"{system or ''}\n{text}", answer):
            err.print(reasoning_hint(choice.spec), style=render.META_STYLE)
    if recorder is not None and w.root:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        line = render.summary_line(summary, every_seed=every_seed).plain
        write_atomic(html, recorder.html(source.name, seed, messages, line))
    raise typer.Exit(code)


def answer_fields(generation) -> list[dict]:
    """A structured answer's values, each with how sure the model was of it."""
    return json_fields([e.text for e in generation.events], [e.logprob for e in generation.events])


def print_end(err, summary, structured, color: bool, every_seed: bool = False, confidence: dict | None = None) -> None:
    """After the answer: its summary line, each value's confidence (`structured`:
    the generation of an answer held to a schema) and deliberate's reasons."""
    err.print(render.summary_line(summary, every_seed=every_seed, confidence=confidence))
    if structured is not None:
        err.print(render.fields_table(answer_fields(structured)))
    if getattr(summary, "deliberation", None):  # deliberate: why it chose
        err.print(deliberation_table(summary.deliberation, color))


def read_schema(path: Path | None):
    """The JSON schema in file `path` (None: none), checked by the grammar engine
    when the request is prepared."""
    if path is None:
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"--json-schema {path}: no such file; give a JSON schema file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--json-schema {path}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"--json-schema {path} is not JSON ({e}); give a JSON schema file") from None


def _check_run_options(choice, html: Path | None, raw: bool, system: str | None) -> None:
    if choice.spec.whole_answers and html is not None:
        raise ConfigError(f"--html records one token stream; --sampler {choice.asked} does not support it yet")
    if raw and system is not None:
        raise ConfigError("--system needs the chat template; drop --raw or --system")
    if html is not None and (html.is_dir() or not html.parent.is_dir()):
        raise ConfigError(
            f"--html {html}: {'is a directory' if html.is_dir() else 'its folder does not exist'}; "
            "give a file name in an existing folder"
        )


def consoles(no_color: bool, root: bool):
    """(stdout's console, stderr's, whether tokens are coloured): colours when stdout is
    a terminal that takes them; ranks other than 0 print to stdout, which goes nowhere."""
    out = render.make_console(no_color=no_color)
    color = not no_color and out.is_terminal and not out.no_color
    if not color:
        out = render.make_console(no_color=True)
    err = render.make_console(stderr=True, no_color=not color)
    if not root:
        out = err = render.make_console(no_color=True)
    return out, err, color


def stream(generation, begin, show, json_lines: bool, out, cut_by_context: bool, extra=None):
    """Hand every token of `generation` to `show` (after `begin`); Ctrl-C or SIGTERM
    stops it with what was generated shown. (exit code, summary). `extra(summary)`:
    more of the JSON summary."""
    code, shown = 0, 0
    try:
        try:
            begin()
            for event in generation:
                with deferred():
                    show(event)
                    shown += 1
        except KeyboardInterrupt as interrupt:  # Ctrl-C or SIGTERM, in prefill or decode
            generation.finish_reason = "interrupted"
            code = exit_code(interrupt)
            # A token the signal caught between being generated and being shown is
            # shown now: the summary counts it, and nothing generated is lost.
            for event in generation.events[shown:]:
                show(event)
        except ContextOverflowError:  # a branch rollout looked past the end of the context
            generation.finish_reason = "context"
        if generation.finish_reason == "length" and cut_by_context:
            generation.finish_reason = "context"
        summary = generation.summary()
        if json_lines:
            sys.stdout.write(json_line({"summary": {**summary.to_dict(), **(extra(summary) if extra else {})}}))
        else:
            out.print()
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
        raise typer.Exit(0) from None
    return code, summary


def register(app: typer.Typer):
    app.command()(run)
