"""`entropix-mlx calibrate [--model M] [--out FILE]`: measure the model's metrics
on built-in prompts and write its thresholds to its model card."""

import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from entropix_mlx.accel.weights import default_weights
from entropix_mlx.distributed import check_same_model, run_on_root, world
from entropix_mlx.errors import ConfigError
from entropix_mlx.model.loading import model_identity, resolve
from entropix_mlx.sampling.cards import checked_user_cards_dir, shipped_card, user_card_path

from .options import ModelOpt, WeightsOpt
from .signals import exit_code

# entropix_mlx.eval is imported when the command runs: app.py imports every command's
# module at each start (--help too), and only calibrate needs it here.


def calibrate(
    ctx: typer.Context,
    model: ModelOpt = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            dir_okay=False,
            help="Card to write (default: the shipped models/<name>.toml, else the model's user card).",
        ),
    ] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Tokens generated per prompt.")] = 24,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Random seed of the sampled answers.")] = 0,
    tune: Annotated[
        bool,
        typer.Option(
            "--tune",
            help="Then compare the strategy settings in calibrate.TUNE_CANDIDATES on the built-in "
            "dev split and open text, and write the chosen one and every trial to the card "
            "(about an hour on a busy 2-core CPU).",
        ),
    ] = False,
    limit: Annotated[
        int | None,
        typer.Option(
            "--limit", min=1, help="With --tune: only the first N dev items and open prompts (a quick check)."
        ),
    ] = None,
    keep_thresholds: Annotated[
        bool,
        typer.Option(
            "--keep-thresholds",
            help="With --tune: tune on the card's thresholds as they are, without "
            "measuring them again (a re-measure may move them, and with them "
            "the figures of earlier trials).",
        ),
    ] = False,
    only: Annotated[
        str | None,
        typer.Option(
            "--only",
            help="With --tune: only the candidates whose name contains this text; the card's "
            "other trials stay on record as earlier ones.",
        ),
    ] = None,
    weights: WeightsOpt = default_weights(),
):
    """Measure the Entropix thresholds for a model (seconds to a minute: 16 short answers in one batch); --tune
    also chooses its strategy settings on the dev split (an hour or more on a CPU)."""
    from entropix_mlx.eval.calibrate import PROMPTS, QUANTILES
    from entropix_mlx.eval.calibrate import calibrate as run_calibration

    if (keep_thresholds or only is not None) and not tune:
        raise ConfigError("--keep-thresholds and --only apply with --tune only; add --tune or leave them out")
    candidates = tune_candidates(only)
    if out is None and shipped_card(resolve(model).name).is_file():
        out = shipped_card(resolve(model).name)
    w = world()  # under mlx.launch: each rank measures a share of the prompts; rank 0 writes and prints
    if out is not None:
        run_on_root(w, lambda: check_writable(out))  # before minutes of work, not after
    check_same_model(w, resolve(model).path)
    loaded = ctx.obj.load(model, weights, card=False)  # the card is what this measures
    llm, tokenizer, source = loaded.model, loaded.tokenizer, loaded.source
    identity = None
    if out is None:  # a model without a shipped card: its user card
        identity = model_identity(source)
        folder, why = checked_user_cards_dir()
        if why:
            raise ConfigError(f"cannot write the user card: {why}; choose a place with --out")
        out = user_card_path(folder, source.name, identity)
    if keep_thresholds:
        run_on_root(w, lambda: check_card_exists(out))
        return tune_card(llm, tokenizer, source.name, out, limit, candidates, w.root)

    def progress(i, n):
        print(f"\ranswers {i}/{n}", end="", file=sys.stderr, flush=True)

    try:
        path, found, samples = run_calibration(
            llm,
            tokenizer,
            source.name,
            out,
            PROMPTS,
            max_tokens,
            seed,
            progress=progress if w.root else None,
            identity=identity,
        )
    except KeyboardInterrupt as interrupt:  # Ctrl-C or SIGTERM: the card is written to a temporary
        # file and renamed, so it is either the old one or the new one, whole
        print(f"\ninterrupted: {out} was not changed", file=sys.stderr)
        raise typer.Exit(exit_code(interrupt)) from None
    except OSError as e:  # e.g. the disk filled up while writing
        print(file=sys.stderr)
        raise ConfigError(
            f"cannot write the card {out}: {e.strerror or e}; "
            "the old card is unchanged; free space or choose another place with --out"
        ) from None
    if w.root:
        print(f"\r{len(samples['entropy'])} steps over {len(PROMPTS)} prompts", file=sys.stderr)
        for name, value in found.items():
            metric, q = QUANTILES[name]
            unit = "bits" if metric == "entropy" else "bits^2"
            print(f"  {name:16} {value:8.4f} {unit:6}  ({metric} quantile {q:g})")
        print(f"wrote {path}")
    if tune:
        tune_card(llm, tokenizer, source.name, path, limit, candidates, w.root)


def tune_candidates(only: str | None):
    from entropix_mlx.eval.tune import TUNE_CANDIDATES

    if only is None:
        return TUNE_CANDIDATES
    chosen = tuple(c for c in TUNE_CANDIDATES if only in c[0])
    if not chosen:
        raise ConfigError(
            f"no tuning candidate's name contains {only!r}; the names are: "
            + "; ".join(name for name, _ in TUNE_CANDIDATES)
        )
    return chosen


def check_card_exists(path: Path):
    if not path.is_file():
        raise ConfigError(
            f"--keep-thresholds needs an existing card, and {path} does not exist; run `entropix-mlx calibrate` first"
        )


def tune_card(llm, tokenizer, name: str, path: Path, limit: int | None, candidates, root: bool = True):
    """Tune the card's strategy settings on the dev split and print every trial
    (under a launcher, rank 0 prints)."""
    from entropix_mlx.eval.tune import tune as run_tuning

    def tuning_progress(trial):
        print(f"tuning: {trial}", file=sys.stderr, flush=True)

    try:
        chosen, trials, greedy, _ = run_tuning(
            llm, tokenizer, name, path, candidates, limit=limit, progress=tuning_progress if root else None
        )
    except KeyboardInterrupt as interrupt:
        if root:
            print(f"\ninterrupted: the tuning in {path} is unchanged", file=sys.stderr)
        raise typer.Exit(exit_code(interrupt)) from None
    if not root:
        return
    print(f"greedy: dev accuracy {greedy['accuracy']:.3f}")
    for t in trials:
        o = t["open"]
        print(
            f"  {t['name']:36} dev accuracy {t['accuracy']:.3f}  W/L/T {t['wins']}/{t['losses']}/{t['ties']}"
            f"  p {t['p']:.3f}  repeated-4-gram {o['repeated_4gram_share']:.3f}  loops {o['loops']}"
            f"  mean logprob {o['mean_logprob']:.3f}"
        )
    print(f"chose {chosen['name']!r}; wrote {path}")


def check_writable(path: Path):
    """The card's folder must exist (or be creatable) and take a new file: the
    card is written as a temporary file there, then renamed over the old one."""
    folder = next((p for p in path.parents if p.exists()), None)
    if folder is not None and not folder.is_dir():
        raise ConfigError(
            f"cannot write the card {path}: {folder} is a file, not a folder; choose another place with --out"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as e:
        raise ConfigError(
            f"cannot write the card {path}: {e.strerror or e}; choose a writable place with --out"
        ) from None
    if path.is_dir():
        raise ConfigError(f"--out {path} is a directory; give a file name, e.g. {path / 'model.toml'}")


def register(app: typer.Typer):
    app.command()(calibrate)
