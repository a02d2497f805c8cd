"""`entropix-mlx chat`: a multi-turn conversation in the terminal, or scripted
through a pipe (one user message per line).

The KV cache stays between turns (entropix_mlx.decode.chat.Conversation, each turn
prepared by the loaded model as `run` prepares its prompt): a turn runs
only the tokens the cache does not hold yet. Everything goes to stdout, which is
the session's transcript; only start-up errors go to stderr.
"""

import json
import sys
from pathlib import Path

import typer

from entropix_mlx.accel.weights import default_weights
from entropix_mlx.distributed import world
from entropix_mlx.errors import ConfigError, ContextOverflowError, EntropixError
from entropix_mlx.files import write_atomic
from entropix_mlx.front import DEFAULT_SAMPLER, SAMPLER_NAMES, choose
from entropix_mlx.front.registry import sampler_legend, spec_for
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
from .signals import Terminated, deferred

COMMANDS = {
    "/help": "show the commands",
    "/reset": "start a new conversation (keeps the system prompt and sampler)",
    "/stats": "tokens prefilled in the last turn, cache length, strategy counts so far",
    "/sampler NAME": f"switch sampler ({', '.join(SAMPLER_NAMES)})",
    "/seed N": "seed of the next answer (each later answer uses the next number)",
    "/system TEXT": "set the system prompt; '/system' alone removes it",
    "/save FILE": "write the transcript, with each token's strategy, as JSON",
    "/quit": "leave (also /exit, Ctrl-D)",
}


class ChatSession:
    def __init__(
        self,
        loaded,
        choice,
        sampler_options,
        max_tokens,
        seed,
        system,
        no_color,
        penalties=None,
        verbose=False,
    ):
        self.loaded, self.verbose = loaded, verbose
        self.penalties = penalties or {}  # presence, frequency, repetition, as asked (LoadedModel.prepare)
        self.source, self.tokenizer = loaded.source, loaded.tokenizer
        self.sampler_options = sampler_options  # config path and CLI overrides, for /sampler
        self.sampler = self.make_sampler(choice)
        self.max_tokens = max_tokens
        self.base_seed = self.next_seed = seed
        self.conversation = loaded.conversation(system or None)
        self.interactive = sys.stdin.isatty()
        self.writes_files = True
        self.hinted = False  # the reasoning hint is shown once a session
        self.out = render.make_console(no_color=no_color)
        self.color = not no_color and self.out.is_terminal and not self.out.no_color
        if not self.color:
            self.out = render.make_console(no_color=True)

    # -- output ---------------------------------------------------------------

    def meta(self, text):
        self.out.print(text, style=render.META_STYLE)

    def show_sampler(self):
        self.meta(header(self.source, self.sampler, self.next_seed, self.conversation.model, self.verbose))
        if self.color:
            self.out.print(render.legend(sampler_legend(self.sampler, self.conversation.model.args.vocab_size)))

    def make_sampler(self, choice):
        """The sampler of `choice` (what the command line asked for, resolved once),
        or of a name /sampler gives, with the options it takes (--config, sampling
        parameters, --budget, --reasoning)."""
        o = self.sampler_options
        choice = choose(choice, o["params"]) if isinstance(choice, str) else choice
        settings = {"budget": o["budget"]} if choice.spec.budget else {}
        reasoning = choice.reasons(o["reasoning"])
        return self.loaded.sampler(choice.name, o["config"], reasoning, **choice.params, **settings)

    # -- the loop -------------------------------------------------------------

    def read_line(self) -> str | None:
        """The next user line, or None to quit (Ctrl-D, end of the pipe, Ctrl-C twice)."""
        prompt = ("\001\033[1m\002>>> \001\033[0m\002" if self.color else ">>> ") if self.interactive else ""
        warned = False
        while True:
            try:
                line = input(prompt)
            except EOFError:
                if self.interactive:
                    self.out.print()
                return None
            except Terminated:  # SIGTERM at the prompt: leave now (exit 143)
                raise
            except KeyboardInterrupt:
                if warned or not self.interactive:
                    self.out.print()
                    return None
                warned = True
                self.out.print()
                self.meta("(Ctrl-C again to quit; /quit or Ctrl-D also leave)")
                continue
            if not self.interactive:
                self.out.print(f">>> {line}")  # so a scripted transcript shows what was asked
            return line

    def loop(self):
        if hasattr(sys.stdin, "reconfigure"):  # bytes that are not UTF-8 become U+FFFD, not a crash
            sys.stdin.reconfigure(errors="replace")
        if self.interactive:
            try:  # line editing and history; importing readline changes input(), so on a terminal only
                import readline  # noqa: F401
            except ImportError:
                pass
        self.show_sampler()
        if self.interactive:
            self.meta("Type a message; /help lists the commands, /quit or Ctrl-D leaves.")
        while (line := self.read_line()) is not None:
            line = line.strip()
            if not line:
                continue
            try:
                if line.startswith("/"):
                    if self.command(line) == "quit":
                        break
                else:
                    self.answer(line)
            except KeyboardInterrupt as interrupt:  # during a command, or a second Ctrl-C while handling the first
                self.conversation.recover()
                self.out.print()
                self.meta("interrupted")
                if isinstance(interrupt, Terminated):
                    raise

    def answer(self, text: str):
        turn, full, interrupted, shown = None, False, None, 0
        try:
            turn = self.conversation.ask(
                text, self.sampler, max_tokens=self.max_tokens, seed=self.next_seed, penalties=self.penalties
            )
            self.next_seed += 1
            if hasattr(turn.generation, "on_row"):  # deliberate: show the branches as they finish
                turn.generation.on_row = deliberation_progress(self.out, self.conversation.tokenizer, self.color)
            for event in turn:
                with deferred():  # a token is written and counted as written, never one without the other
                    render.write_token(self.out, event.text, event.strategy, self.color)
                    shown += 1
        except KeyboardInterrupt as interrupt:
            interrupted = interrupt
            # As in `run`: a token the signal caught between being generated and being
            # shown is shown now; the answer kept and the summary both count it.
            for event in turn.events[shown:] if turn is not None else ():
                render.write_token(self.out, event.text, event.strategy, self.color)
        except ContextOverflowError as e:
            if turn is None:  # refused before anything ran
                self.meta(f"context full: {e}")
                return
            full = True  # a branch rollout looked past the end of the context
        if turn is None:  # Ctrl-C before the turn began
            self.conversation.recover()
            self.out.print()
            self.meta("interrupted")
        else:
            self.conversation.finish(turn, interrupted=interrupted is not None)
            full = full or turn.finish_reason == "context"  # the answer stopped where the context ends
            self.out.print()
            summary = turn.generation.summary()
            confidence = self.loaded.confidence([e.to_dict() for e in turn.events], summary.finish_reason)
            every_seed = every_seed_gives(self.sampler, summary)
            self.out.print(
                render.summary_line(summary, prefilled=turn.prefilled, every_seed=every_seed, confidence=confidence)
            )
            if getattr(summary, "deliberation", None):  # deliberate: why it chose
                self.out.print(deliberation_table(summary.deliberation, self.color))
            self.hint_reasoning(text, turn)
            if full:
                self.meta(
                    f"context full: the conversation reached {self.conversation.context_size} tokens; "
                    "/reset to start a new conversation"
                )
        if isinstance(interrupted, Terminated):  # SIGTERM: the answer so far is shown; now leave
            raise interrupted

    def hint_reasoning(self, text: str, turn):
        """Once a session: a chain of thought answered without --reasoning hears of it."""
        if self.hinted or self.sampler_options["reasoning"] or spec_for(self.sampler) is None:
            return
        answer = "".join(e.text for e in turn.events)
        if looks_like_chain_of_thought(f"{self.conversation.system or ''}\n{text}", answer):
            self.meta(reasoning_hint(spec_for(self.sampler)))
            self.hinted = True

    # -- commands -------------------------------------------------------------

    def command(self, line: str):
        name, _, arg = line.partition(" ")
        arg = arg.strip()
        if name in ("/quit", "/exit"):
            return "quit"
        handler = {
            "/help": self.help,
            "/reset": self.reset,
            "/stats": self.stats,
            "/sampler": self.set_sampler,
            "/seed": self.set_seed,
            "/system": self.set_system,
            "/save": self.save,
        }.get(name)
        if handler is None:
            self.meta(f"unknown command '{name}'; /help lists the commands")
            return None
        try:
            handler(arg)
        except EntropixError as e:
            self.meta(f"error: {e}")
        return None

    def help(self, _arg):
        width = max(map(len, COMMANDS))
        for usage, what in COMMANDS.items():
            self.out.print(f"  {usage.ljust(width)}  {what}")
        self.meta("Ctrl-C stops an answer (the conversation stays); at the prompt it asks before quitting.")

    def reset(self, _arg):
        self.conversation.reset()
        self.next_seed = self.base_seed
        self.meta("new conversation")

    def stats(self, _arg):
        conv = self.conversation
        last = conv.turns[-1] if conv.turns else None
        if last is None:
            self.meta("no turns yet")
        else:
            self.meta(f"last turn: prefilled {last.prefilled} of {len(last.prompt_tokens)} prompt tokens")
        self.meta(f"cache: {len(conv.cached_tokens)} of {conv.context_size} tokens · turns: {len(conv.turns)}")
        counts = render.strategy_counts(conv.strategy_counts)
        line = render.Text()
        line.append("strategies so far: ", style=render.META_STYLE)
        line.append_text(counts) if conv.strategy_counts else line.append("none", style=render.META_STYLE)
        self.out.print(line)

    def set_sampler(self, arg):
        if not arg:
            self.meta(f"sampler: {self.sampler.name}; give a name to switch")
            return
        if arg not in SAMPLER_NAMES:
            raise ConfigError(f"unknown sampler '{arg}'; choose one of: {', '.join(SAMPLER_NAMES)}")
        self.sampler = self.make_sampler(arg)
        self.show_sampler()

    def set_seed(self, arg):
        try:
            seed = int(arg)
            if not 0 <= seed < 2**63:
                raise ValueError
        except ValueError:
            self.meta("error: /seed needs a whole number from 0 to 2**63-1, e.g. /seed 42")
            return
        self.base_seed = self.next_seed = seed
        self.meta(f"seed: {seed}")

    def set_system(self, arg):
        self.conversation.system = arg or None
        self.meta(f"system prompt: {arg}" if arg else "system prompt removed")

    def penalties_given(self) -> dict | None:
        """The penalties as they act (None: off), for /save."""
        p = self.loaded.penalties(**self.penalties)
        if p is None:
            return None
        return {"presence": p.presence, "frequency": p.frequency, "repetition": p.repetition, "window": p.window}

    def save(self, arg):
        if not self.writes_files:  # a rank other than 0: the transcript is rank 0's to write
            return
        if not arg:
            self.meta("error: /save needs a file name, e.g. /save chat.json")
            return
        # The top level holds the settings as they are now (after any /sampler and
        # /seed); each turn, the sampler and seed it answered with.
        data = {
            "model": self.source.name,
            "sampler": self.sampler.name,
            "seed": self.base_seed,
            **({"penalties": given} if (given := self.penalties_given()) is not None else {}),
            **self.conversation.transcript(),
        }
        path = Path(arg).expanduser()
        try:
            write_atomic(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        except OSError as e:
            self.meta(
                f"error: cannot write {path}: {e.strerror or e}; choose a folder that exists and is "
                "writable (the conversation is kept)"
            )
            return
        self.meta(f"saved {render.plural(len(self.conversation.turns), 'turn')} to {path}")


def chat(
    ctx: typer.Context,
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
    no_color: NoColorOpt = False,
    weights: WeightsOpt = default_weights(),
    no_cache: NoCacheOpt = False,
    budget: BudgetOpt = None,
    reasoning: ReasoningOpt = False,
    verbose: VerboseOpt = False,
):
    """Talk with the model, turn after turn; /help lists the commands."""
    params = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p}
    check_options(sampler, config, model, budget, reasoning, **params)
    choice = choose(sampler, params)  # once: the session builds its first sampler from it
    check_config(choice, config, model, budget, reasoning)
    loaded = ctx.obj.load(model, weights, tensor_parallel=True, cache=not no_cache)  # sharded under mlx.launch
    w = world()  # every rank reads the same lines (mlx.launch gives each the terminal's input); rank 0 prints
    quiet_unless_root(w)
    options = {"config": config, "params": params, "budget": budget, "reasoning": reasoning}
    penalties = dict(presence=presence_penalty, frequency=frequency_penalty, repetition=repetition_penalty)
    session = ChatSession(loaded, choice, options, max_tokens, seed, system, no_color, penalties, verbose)
    session.writes_files = w.root
    try:
        session.loop()
    except Terminated:  # SIGTERM: what was shown stays; leave with 143
        raise typer.Exit(143) from None
    except BrokenPipeError:
        silence_stdout()


def register(app: typer.Typer):
    app.command()(chat)
