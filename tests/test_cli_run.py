"""`entropix-mlx run`, `chat` (through a pipe) and `models`, driven in-process
through `cli.app.main` (the same entry point as the installed script, so error
handling is the real one). The CLI keeps loaded models in-process, so the real
model loads once for this whole file."""

import json
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import SHELF, make_tiny_tokenizer
from entropix_mlx.cli import chat as chat_cmd
from entropix_mlx.cli import loaded, models_cmd
from entropix_mlx.cli import run as run_cmd
from entropix_mlx.cli.app import main
from typer.testing import CliRunner

from entropix_mlx.front import LoadedModel
from entropix_mlx.sampling.samplers import GreedySampler

ESC = "\x1b["
STRATEGIES = {"argmax", "think", "branch", "resample", "adaptive", "sample"}
PROMPT = "What is the capital of France?"


def invoke(*args, input=None):
    """(exit code, stdout, stderr) of `entropix-mlx ARGS` run in this process."""
    with CliRunner().isolation(input=input) as (out, err, _):
        try:
            main([str(a) for a in args], shelf=SHELF)
        except SystemExit as e:
            code = e.code
        sys.stdout.flush()
        sys.stderr.flush()
        return code, out.getvalue().decode(), err.getvalue().decode()


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and "Traceback" not in stderr
    return lines[0]


def cli_command():
    return [sys.executable, "-c", "from entropix_mlx.cli.app import main; main()"]


def rest_of(proc, timeout=120):
    """Everything `proc` writes from now until it exits: (stdout, stderr).
    Unlike communicate(), which reads the pipes' file descriptors, it keeps
    what an earlier readline() had already read ahead into the text buffer
    (communicate() loses those lines). A process still running after
    `timeout` seconds is killed, and its exit code says so."""
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        out, err = proc.stdout.read(), proc.stderr.read()
        proc.wait()
    finally:
        timer.cancel()
    return out, err


# -- errors a user can provoke: one line, exit 2 ------------------------------

BAD_FLAGS = [
    (["run", "--max-tokens", "0", "hi"], "--max-tokens"),
    (["run", "--max-tokens", "many", "hi"], "--max-tokens"),
    (["run", "--sampler", "nucleus", "hi"], "nucleus"),
    (["run", "--top-p", "0", "hi"], "--top-p"),
    (["run", "--top-p", "1.5", "hi"], "--top-p"),
    (["run", "--min-p", "1", "hi"], "--min-p"),
    (["run", "--temperature", "-0.1", "hi"], "--temperature"),
    (["run", "--top-k", "-3", "hi"], "--top-k"),
    (["run", "--seed", "-1", "hi"], "--seed"),
    (["run", "--bogus", "hi"], "--bogus"),
    (["run"], "PROMPT"),
    (["run", "--sampler", "greedy", "--temperature", "0.7", "hi"], "--temperature"),
    (["run", "--raw", "--system", "be brief", "hi"], "--system"),
    (["run", "-m", "no-such-model", "hi"], "no-such-model"),
    (["run", "--config", "/no/such/file.toml", "hi"], "--config"),
    (["chat", "--sampler", "beam"], "beam"),
    (["chat", "--max-tokens", "-5"], "--max-tokens"),
    (["frobnicate"], "frobnicate"),
]


@pytest.mark.parametrize("args,named", BAD_FLAGS, ids=[" ".join(a) for a, _ in BAD_FLAGS])
def test_bad_flags_print_one_line_and_exit_2(args, named):
    code, out, err = invoke(*args)
    assert code == 2
    assert named in one_error_line(err)
    assert out == ""


def test_unreadable_configs_print_one_line_and_exit_2(tmp_path):
    malformed = tmp_path / "bad.toml"
    malformed.write_text("temperature = [unclosed\n")
    code, out, err = invoke("run", "--config", malformed, "hi")
    assert code == 2 and "bad.toml" in one_error_line(err) and out == ""
    code, out, err = invoke("run", "--config", tmp_path, "hi")  # a directory
    assert code == 2 and "--config" in one_error_line(err)
    code, out, err = invoke("run", "--sampler", "min_p", "--config", malformed, "hi")
    assert code == 2 and "entropix" in one_error_line(err)
    out_of_range = tmp_path / "hot.toml"
    out_of_range.write_text("[sampler]\ntop_p = 1.5\n")
    code, out, err = invoke("chat", "--config", out_of_range)
    assert code == 2 and "top_p" in one_error_line(err)


def test_empty_prompt_from_stdin_is_refused():
    code, out, err = invoke("run", "-", input="\n")
    assert code == 2 and "empty" in one_error_line(err)


def test_system_prompt_goes_first_in_the_template():
    tokenizer = make_tiny_tokenizer()
    ids = run_cmd.prompt_tokens(tokenizer, "hi", "Be brief.", raw=False)
    assert tokenizer.decode(ids) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert tokenizer.decode(run_cmd.prompt_tokens(tokenizer, "hi", None, raw=True)) == "hi"


# -- models --------------------------------------------------------------------


def test_models_lists_the_bundled_model_and_cards(tmp_path, monkeypatch):
    gguf = tmp_path / "mine.gguf"
    gguf.write_bytes(b"GGUF")
    (tmp_path / "mine.toml").write_text(f'source = "{gguf}"\n[sampler]\nlow_entropy = 0.2\n')
    (tmp_path / "nowhere.toml").write_text("[sampler]\nlow_entropy = 0.2\n")
    monkeypatch.setattr(models_cmd, "cards_dir", lambda: tmp_path)
    code, out, err = invoke("models")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["name", "kind", "loads", "from", "card"]
    bundled = next(line for line in lines if line.startswith("smollm2-135m"))
    path = bundled.split()[3]
    assert "bundled" in bundled and path.endswith(".gguf") and Path(path).is_file()
    mine = next(line for line in lines if line.startswith("mine "))
    assert str(gguf) in mine and str(tmp_path / "mine.toml") in mine
    assert "card only" in next(line for line in lines if line.startswith("nowhere "))


# -- chat on a tiny model: context overflow and Ctrl-C, without the real model ----


def test_chat_says_when_the_context_is_full_and_reset_recovers(tiny_ref):
    script = "hello\n" + "x" * 70 + "\n/reset\nhi\n/stats\n"
    code, out, err = invoke("chat", "-m", tiny_ref, "--sampler", "greedy", "--max-tokens", "4", input=script)
    assert code == 0, err
    assert "context full" in out and "/reset" in out
    assert "new conversation" in out
    # after /reset the conversation is fresh: the whole prompt was prefilled
    prefilled, total = map(int, re.findall(r"prefilled (\d+) of (\d+)", out)[-1])
    assert prefilled == total
    assert "turns: 1" in out


def test_chat_save_records_each_turns_sampler_and_seed_and_help_lists_every_sampler(tiny_ref, tmp_path):
    saved = tmp_path / "chat.json"
    script = f"/help\nhello\n/sampler temperature\n/seed 7\nhi\n/save {saved}\n"
    code, out, err = invoke("chat", "-m", tiny_ref, "--sampler", "greedy", "--max-tokens", "3", input=script)
    assert code == 0, err
    help_line = next(line for line in out.splitlines() if "/sampler NAME" in line)
    assert all(name in help_line for name in ("entropix", "greedy", "temperature", "min_p", "deliberate"))
    data = json.loads(saved.read_text())
    assert (data["sampler"], data["seed"]) == ("temperature", 7)  # the settings now, after /sampler and /seed
    assert [(t["sampler"], t["seed"]) for t in data["turns"]] == [("greedy", 0), ("temperature", 7)]
    assert not any("deliberation" in t for t in data["turns"])
    assert f"saved 2 turns to {saved}" in out


def test_chat_save_keeps_deliberates_candidates_and_why_it_chose(tiny_ref, tmp_path):
    saved = tmp_path / "chat.json"
    script = f"hello\n/save {saved}\n/sampler deliberate\n/seed 5\nhi\n/save {saved}\n"
    code, out, err = invoke("chat", "-m", tiny_ref, "--sampler", "greedy", "--max-tokens", "3", input=script)
    assert code == 0, err
    assert "rule: " in out  # the table after the answer
    assert f"saved 1 turn to {saved}" in out and f"saved 2 turns to {saved}" in out
    data = json.loads(saved.read_text())
    assert (data["sampler"], data["seed"]) == ("deliberate", 5)
    first, turn = data["turns"]
    assert (first["sampler"], first["seed"], turn["sampler"], turn["seed"]) == ("greedy", 0, "deliberate", 5)
    d = turn["deliberation"]
    assert len(d["candidates"]) == len(d["table"]) > 1 and "deliberation" not in first
    assert d["candidates"][d["chosen"]]["text"] == turn["assistant"] and d["reason"]
    # chat records no alternatives: no candidate keeps a list of empty ones
    assert not any("top" in c for c in d["candidates"])


class InterruptingSampler:
    """Greedy, but the user presses Ctrl-C at the third step of the first answer."""

    name = "greedy"

    def __init__(self):
        self.steps = 0

    def reset(self):
        pass

    def choose(self, step, key):
        self.steps += 1
        if self.steps == 3:
            raise KeyboardInterrupt
        return GreedySampler().choose(step, key)


def test_ctrl_c_during_an_answer_returns_to_the_prompt(tiny_ref, monkeypatch):
    sampler = InterruptingSampler()
    monkeypatch.setattr(LoadedModel, "sampler", lambda self, *a, **k: sampler)
    code, out, err = invoke("chat", "-m", tiny_ref, "--max-tokens", "5", input="one\ntwo\n/stats\n")
    assert code == 0, err
    assert out.count("stopped: interrupted") == 1
    assert "2 tokens" in out  # the interrupted answer kept what it had printed
    assert "stopped: length" in out  # the second turn ran normally
    assert "turns: 2" in out


def test_a_token_caught_between_generated_and_shown_is_still_shown(tiny_ref, monkeypatch):
    """Ctrl-C after the generator counted its second token but before `run` wrote
    it: the token is written before the summary, which counts exactly the lines."""
    from entropix_mlx.decode.generate import Generation

    class SignalAfterCounting(Generation):
        def __iter__(self):
            for i, event in enumerate(super().__iter__()):
                if i == 1:  # in .tokens and .events, not yet handed out
                    raise KeyboardInterrupt
                yield event

    def generate(self, p, cache=None):
        return SignalAfterCounting(
            self.model, self.tokenizer, p.ids, p.sampler, p.max_tokens, p.seed, cache, p.penalties
        )

    monkeypatch.setattr(LoadedModel, "generate", generate)
    code, out, err = invoke("run", "-m", tiny_ref, "--json", "--raw", "--sampler", "greedy", "--max-tokens", "5", "hi")
    records = [json.loads(line) for line in out.splitlines()]
    assert code == 130, err
    assert records[-1]["summary"]["finish_reason"] == "interrupted"
    assert records[-1]["summary"]["tokens"] == len(records) - 1 == 2


def test_chat_shows_a_token_caught_between_generated_and_shown(tiny_ref, monkeypatch):
    """The same moment in `chat`: the interrupted answer's second token is in the
    conversation and counted by the summary, so it is written before the summary."""
    from entropix_mlx.decode.generate import Generation
    from entropix_mlx.front import loaded as loaded_module

    made = []

    class SignalAfterCounting(Generation):
        def __iter__(self):
            for i, event in enumerate(super().__iter__()):
                if i == 1 and len(made) == 1:  # first answer only: in .events, not yet handed out
                    raise KeyboardInterrupt
                yield event

    def generate(*args, **kwargs):
        made.append(SignalAfterCounting(*args, **kwargs))
        return made[-1]

    written = []
    write_token = chat_cmd.render.write_token
    monkeypatch.setattr(loaded_module, "generate", generate)  # chat's turns run through the loaded model
    monkeypatch.setattr(
        chat_cmd.render, "write_token", lambda out, text, *a: (written.append(text), write_token(out, text, *a))
    )
    code, out, err = invoke(
        "chat", "-m", tiny_ref, "--sampler", "greedy", "--max-tokens", "5", "--no-color", input="one\n"
    )
    assert code == 0, err
    first = made[0]
    assert len(first.events) == 2 and first.finish_reason == "interrupted"
    assert written == [e.text for e in first.events]
    assert "2 tokens" in out and "stopped: interrupted" in out


def test_a_token_caught_before_its_event_exists_is_not_counted(tiny_ref, monkeypatch):
    """Ctrl-C after the second token joined the answer but before its event
    existed (here: while the event is being made): it was never shown, so the
    summary counts one token, the one line written."""
    from entropix_mlx.decode import generate as generation_module

    made = []

    def event_then_interrupt(*args):
        made.append(args)
        if len(made) == 2:
            raise KeyboardInterrupt
        return TokenEvent(*args)

    TokenEvent = generation_module.TokenEvent
    monkeypatch.setattr(generation_module, "TokenEvent", event_then_interrupt)
    code, out, err = invoke("run", "-m", tiny_ref, "--json", "--raw", "--sampler", "greedy", "--max-tokens", "5", "hi")
    records = [json.loads(line) for line in out.splitlines()]
    assert code == 130, err
    assert records[-1]["summary"]["tokens"] == len(records) - 1 == 1


@pytest.mark.parametrize("send", ["os.kill", "interrupt_main"])
@pytest.mark.parametrize(
    "sig,raised", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, "Terminated")], ids=["SIGINT", "SIGTERM"]
)
def test_a_signal_waits_for_the_end_of_a_deferred_block(send, sig, raised):
    """`deferred()`: Ctrl-C or SIGTERM inside the block (a token's line being
    written and counted) is raised right after it, never between the two.
    `interrupt_main` is a signal whose handler is already pending when the
    block starts (it arrived just before): Python runs that handler inside the
    block, where blocking the signal itself could not stop it."""
    import _thread
    import os

    from entropix_mlx.cli import signals

    raised = signals.Terminated if raised == "Terminated" else raised
    done = []
    with pytest.raises(raised), signals.interrupts_raise():
        with signals.deferred():
            if send == "os.kill":
                os.kill(os.getpid(), sig)
            else:
                _thread.interrupt_main(sig)
            done.append("written")
            sum(range(1000))  # bytecodes, calls: points where Python runs a pending handler
            done.append("counted")
        done.append("after the block")
    assert done == ["written", "counted"]
    assert signals.exit_code() == (143 if sig == signal.SIGTERM else 130)


# -- the real bundled model ----------------------------------------------------


def json_run(*args, input=None):
    code, out, err = invoke("run", "--json", *args, input=input)
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert "summary" in records[-1]
    return records[:-1], records[-1]["summary"]


@pytest.mark.slow
def test_run_json_lines_then_plain_text_from_stdin_agree():
    tokens, summary = json_run("--sampler", "greedy", "--max-tokens", "10", PROMPT)
    for record in tokens:
        assert {
            "token",
            "text",
            "strategy",
            "entropy",
            "varentropy",
            "attn_entropy",
            "attn_varentropy",
            "agreement",
            "interaction_strength",
            "temperature",
            "logprob",
        } <= record.keys()
        assert record["strategy"] == "argmax" and record["logprob"] <= 0
    text = "".join(r["text"] for r in tokens)
    assert "Paris" in text
    assert {"tokens", "strategy_counts", "prompt_tps", "generation_tps", "peak_memory_gb"} <= summary.keys()
    assert summary["tokens"] == len(tokens) and summary["strategy_counts"] == {"argmax": len(tokens)}
    assert summary["finish_reason"] == "eos"  # the answer is shorter than 10 tokens

    # The same prompt from stdin, as plain text: the same answer, no escape codes.
    code, out, err = invoke("run", "-", "--sampler", "greedy", "--max-tokens", "10", "--no-color", input=PROMPT + "\n")
    assert code == 0, err
    assert out == text + "\n"
    assert ESC not in out + err
    assert f"{len(tokens)} tokens" in err and f"argmax {len(tokens)}" in err and "stopped: eos" in err


@pytest.mark.slow
def test_run_passes_sampling_flags_and_raw_prompts():
    tokens, summary = json_run(
        "--sampler",
        "temperature",
        "--temperature",
        "0.5",
        "--top-k",
        "5",
        "--top-p",
        "0.8",
        "--min-p",
        "0.05",
        "--seed",
        "7",
        "--max-tokens",
        "2",
        PROMPT,
    )
    for record in tokens:
        assert record["strategy"] == "sample"
        assert (record["temperature"], record["top_k"], record["top_p"], record["min_p"]) == (0.5, 5, 0.8, 0.05)
    templated = summary["prompt_tokens"]
    _, raw = json_run("--raw", "--sampler", "greedy", "--max-tokens", "1", PROMPT)
    assert raw["prompt_tokens"] < 10 < templated  # no system prompt, no role markers


@pytest.mark.slow
def test_run_default_sampler_is_entropix():
    tokens, summary = json_run("--max-tokens", "3", PROMPT)
    assert tokens and {r["strategy"] for r in tokens} <= {"argmax", "think", "branch", "resample", "adaptive"}
    assert sum(summary["strategy_counts"].values()) == summary["tokens"] == len(tokens)


@pytest.mark.slow
def test_chat_through_a_pipe_remembers_and_reuses_the_cache(tmp_path):
    transcript = tmp_path / "chat.json"
    script = (
        "\n".join(
            [
                "My name is Alice. Please remember it.",
                "What is my name?",
                "/stats",
                f"/save {transcript}",
                "/reset",
                "What is my name?",
                "/stats",
                "/quit",
                "this line comes after /quit",
            ]
        )
        + "\n"
    )
    code, out, err = invoke("chat", "--sampler", "greedy", "--max-tokens", "9", input=script)
    assert code == 0, err
    assert ESC not in out
    # Each user line is echoed as ">>> line", then the answer, then its summary line.
    answers = re.findall(r"^>>> ([^/].*)\n(.*)\n\d+ tokens? · prefilled", out, re.M)
    assert [q for q, _ in answers] == ["My name is Alice. Please remember it.", "What is my name?", "What is my name?"]
    assert "Alice" in answers[1][1]  # the second turn depends on the first
    assert "Alice" not in answers[2][1]  # the same question after /reset does not know the name
    stats = [tuple(map(int, m)) for m in re.findall(r"prefilled (\d+) of (\d+) prompt tokens", out)]
    (prefilled, history), (fresh_prefilled, fresh_total) = stats
    assert prefilled < history - 40  # only the end of the first answer and the new message
    assert fresh_prefilled == fresh_total  # after /reset, nothing is cached
    assert "turns: 2" in out and "turns: 1" in out
    assert "this line comes after /quit" not in out

    saved = json.loads(transcript.read_text())
    assert [t["user"] for t in saved["turns"]] == ["My name is Alice. Please remember it.", "What is my name?"]
    assert saved["turns"][1]["assistant"] == answers[1][1]
    assert saved["turns"][1]["prefilled_tokens"] == prefilled
    assert all(t["strategy"] == "argmax" for turn in saved["turns"] for t in turn["tokens"])


# -- signals and pipes, in a real process -------------------------------------


@pytest.mark.slow
def test_ctrl_c_keeps_the_output_prints_the_summary_and_exits_130():
    # --raw: a 4-token prompt, since prefill costs about as much per token as decoding on this CPU
    proc = subprocess.Popen(
        cli_command() + ["run", "--json", "--raw", "--sampler", "greedy", "--max-tokens", "200", "Once upon a time"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    first = json.loads(proc.stdout.readline())
    proc.send_signal(signal.SIGINT)
    rest, err = rest_of(proc)
    records = [first] + [json.loads(line) for line in rest.splitlines()]
    summary = records[-1]["summary"]
    assert proc.returncode == 130, err
    assert summary["finish_reason"] == "interrupted"
    assert summary["tokens"] == len(records) - 1 < 200
    assert "Traceback" not in err


@pytest.mark.slow
def test_a_run_started_with_ctrl_c_ignored_keeps_ignoring_it():
    """`nohup`, or a script's background job: SIGINT ignored from the start stays ignored
    (cli/signals.py installs no handler over it), so the answer runs to its end."""
    proc = subprocess.Popen(
        cli_command() + ["run", "--json", "--raw", "--sampler", "greedy", "--max-tokens", "12", "Once upon a time"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    first = json.loads(proc.stdout.readline())
    proc.send_signal(signal.SIGINT)
    rest, err = rest_of(proc)
    records = [first] + [json.loads(line) for line in rest.splitlines()]
    assert proc.returncode == 0, err
    assert records[-1]["summary"]["finish_reason"] == "length"
    assert records[-1]["summary"]["tokens"] == len(records) - 1 == 12


@pytest.mark.slow
def test_closed_pipe_exits_quietly():
    proc = subprocess.Popen(
        cli_command() + ["run", "--json", "--raw", "--sampler", "greedy", "--max-tokens", "20", "Once upon a time"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    json.loads(proc.stdout.readline())
    proc.stdout.close()  # what `| head -1` does after its first line
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0
    assert err == ""


def test_run_and_chat_take_the_repetition_penalties(tiny_ref):
    """The tiny model loops under greedy decoding; --repetition-penalty stops it in
    `run` and in `chat`, and a penalty that cannot work is one line, exit 2."""

    def tokens(*options):
        code, out, err = invoke(
            "run", "-m", tiny_ref, "a b", "--sampler", "greedy", "--max-tokens", "10", "--json", *options
        )
        assert code == 0, err
        return [json.loads(line)["token"] for line in out.splitlines() if '"token"' in line]

    plain = tokens()
    assert len(set(plain)) < len(plain)
    penalised = tokens("--repetition-penalty", "50")
    assert len(penalised) == len(set(penalised)) == 10
    assert tokens("--presence-penalty", "2", "--frequency-penalty", "-1") != penalised
    saved = tiny_ref + ".json"
    for options in ([], ["--repetition-penalty", "50"]):
        script = f"a b\n/save {saved}\n"
        code, _, err = invoke(
            "chat", "-m", tiny_ref, "--sampler", "greedy", "--max-tokens", "8", *options, input=script
        )
        assert code == 0, err
        data = json.loads(Path(saved).read_text())
        said = [t["token"] for t in data["turns"][0]["tokens"]]
        assert (len(said) == len(set(said))) == bool(options), said
        # /save records the penalties, so the conversation can be replayed
        assert data.get("penalties") == (
            {"presence": 0.0, "frequency": 0.0, "repetition": 50.0, "window": 64} if options else None
        )
    for bad in (["--repetition-penalty", "0"], ["--presence-penalty", "3"]):
        code, _, err = invoke("run", "-m", tiny_ref, "a b", *bad)
        assert code == 2 and bad[0] in err and "Traceback" not in err


def test_no_help_shows_a_type_after_an_on_off_flag():
    """Flags take no value: no command's --help writes `<bool>` after one (Typer
    0.29 did, for --json, --raw, --no-color, --help ...), while options that take
    a value keep their type."""
    from entropix_mlx.cli.app import app, register_commands

    register_commands()
    names = [None] + [c.name or c.callback.__name__.removesuffix("_cmd") for c in app.registered_commands]
    assert len(names) > 8
    for name in names:
        code, out, err = invoke(*([name] if name else []), "--help")
        assert code == 0 and "--help" in out, (name, err)
        assert "<bool>" not in out, name
    assert "<int>" in invoke("run", "--help")[1]


def test_the_header_says_how_the_model_runs_in_plain_words(tiny_ref, monkeypatch):
    """'fast CPU path', not 'float32 weights · OpenBLAS + thin kernels': the
    technical line only with --verbose."""
    import mlx.core as mx

    monkeypatch.setattr(mx, "default_device", lambda: mx.cpu)
    monkeypatch.setattr(loaded, "blas_name", lambda: "OpenBLAS + thin kernels")
    monkeypatch.setattr(loaded.backend, "blas_name", lambda: "OpenBLAS + thin kernels")
    model = SHELF.loaded[(tiny_ref, "auto")].model
    model.set_dtype(mx.float32)
    code, _, err = invoke("run", "-m", tiny_ref, "hi", "--sampler", "greedy", "--max-tokens", "2")
    head = err.splitlines()[0]
    assert code == 0 and "fast CPU path" in head
    assert not any(word in head for word in ("float32", "OpenBLAS", "kernels", "weights"))
    code, _, err = invoke("run", "-m", tiny_ref, "hi", "--sampler", "greedy", "--max-tokens", "2", "--verbose")
    assert code == 0 and "fast CPU path" in err and "float32 weights · OpenBLAS + thin kernels" in err
    monkeypatch.setattr(loaded, "blas_name", lambda: "MLX's BLAS")
    assert "no OpenBLAS found" in invoke("run", "-m", tiny_ref, "hi", "--max-tokens", "1")[2]


@pytest.mark.slow
def test_the_readmes_first_command_answers_right_and_greedy_does_not():
    """The README's set-up command ends with one question; the default sampler
    answers it right on the bundled model, and greedy (as the README says) does not."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    command = next(line for line in readme.splitlines() if line.startswith("python3 -m venv"))
    run_part = command.split("&& entropix-mlx ")[-1]
    import shlex

    args = shlex.split(run_part)
    assert args[:2] == ["run", "How many legs does a spider have?"] and "--max-tokens" in args

    def answer(*extra):
        code, out, err = invoke(*args, "--json", *extra)
        assert code == 0, err
        return "".join(json.loads(line).get("text", "") for line in out.splitlines()[:-1])

    assert re.search(r"\b8 legs\b", answer())
    assert not re.search(r"\b8\b|eight", answer("--sampler", "greedy"))
    assert "two pairs of legs" in answer("--sampler", "greedy")  # what the README quotes


def test_help_keeps_the_square_brackets_its_options_name():
    """Rich reads `[deliberate]` in a help string as a style tag and drops it ("A
    TOML file's  table sets deliberate."): a bracketed name in an option's help
    is escaped, and shows in --help as written."""
    import re

    import typer
    from entropix_mlx.cli.app import app, register_commands

    register_commands()
    commands = typer.main.get_command(app).commands
    checked = 0
    for command in app.registered_commands:
        name = command.name or command.callback.__name__.removesuffix("_cmd")
        out = invoke(name, "--help")[1]
        for param in commands[name].params:
            for tag in re.findall(r"\[[a-z_]+\]", (getattr(param, "help", None) or "").replace("\\[", "[")):
                assert tag in out, (name, param.name, tag)
                checked += 1
    assert checked >= 1


def test_an_unknown_option_gets_a_suggestion_only_when_one_is_close():
    code, _, err = invoke("chat", "--bogus")
    assert code == 2 and one_error_line(err).startswith("error: no such option: --bogus (see") and "mean" not in err
    code, _, err = invoke("run", "--temprature", "0.5", "hi")
    assert code == 2 and "did you mean --temperature?" in one_error_line(err)


@pytest.mark.slow
def test_the_header_names_the_card_also_with_html(tmp_path):
    # --html wraps the sampler in a recorder; the header still names the sampler's card.
    headers = []
    for extra in ([], ["--html", str(tmp_path / "a.html")]):
        code, _, err = invoke("run", "Hi", "--max-tokens", "2", "--no-color", *extra)
        assert code == 0, err
        headers.append(next(line for line in err.splitlines() if " · sampler " in line))
    assert headers[0] == headers[1] and "shipped card smollm2-135m.toml" in headers[1]
