"""Per-model calibration: measure the metrics on varied prompts, derive thresholds.

Thresholds hand-tuned for one model and vocabulary (the reference's, for
Llama-3.2-1B) put another model in one state nearly all the time. Calibration
runs the model over PROMPTS (short answers, sampled with the reference base
parameters so the text looks like real use), records the six metrics at every
step, and sets each threshold at a quantile of the measured distribution, so
that every strategy gets a share of the tokens (QUANTILES below says which).
The result goes to the model's card, `models/<name>.toml`, written atomically.
"""

import datetime
import functools
import json
import tomllib
from importlib import resources
from pathlib import Path

import numpy as np

from ..distributed import world
from ..errors import ConfigError
from ..files import write_atomic
from ..sampling.cards import shipped_card
from ..sampling.config import SamplerConfig
from ..sampling.metrics import METRIC_NAMES
from ..sampling.settings import read_toml
from ..sampling.strategies import COMPARE, max_entropy, threshold_condition
from .measure import collect

# Varied on purpose: facts, arithmetic, reasoning, code, lists, creative
# writing, advice, definitions, translation, open questions, chit-chat.
PROMPTS = (
    "What is the capital of Australia?",
    "What is 17 + 25? Answer with the number.",
    "Which number is larger, 9.9 or 9.11?",
    "If I have 3 apples and eat one, how many are left? Explain briefly.",
    "Write a Python function that reverses a string.",
    "List three uses of a paperclip.",
    "Write a short poem about the sea.",
    "Tell me a story about a robot who learns to paint.",
    "Give me one tip for sleeping better.",
    "Explain what photosynthesis is in one sentence.",
    "Translate 'good morning' into French.",
    "What is the meaning of life?",
    "Hi! How are you today?",
    "Describe the color blue to someone who cannot see.",
    "Why is the sky blue?",
    "Suggest a name for a coffee shop.",
)


# Where each threshold sits: the q-quantile of the named metric over all
# recorded steps. think_varentropy is special: the q-quantile of varentropy
# among the steps whose entropy is above medium_entropy ("of the uncertain
# steps, the flattest 30% think"), because high entropy never comes with a low
# varentropy in absolute terms. On SmolLM2-135M this gives about 30% argmax,
# 10% think, 11% branch, 7% resample and 42% adaptive decisions; a branch
# accepts branch_rollout_tokens tokens, so its share of tokens is larger.
QUANTILES = {
    "low_entropy": ("entropy", 0.45),
    "low_varentropy": ("varentropy", 0.45),
    "medium_entropy": ("entropy", 0.65),
    "high_entropy": ("entropy", 0.88),
    "high_varentropy": ("varentropy", 0.88),
    "think_varentropy": ("varentropy", 0.30),  # conditional, see above
}


REPORTED_QUANTILES = (0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95)

# A model without a card of its own starts from what won on the bundled model's dev split:
# entropix_mlx/data/new_model.toml, [sampler] and [deliberate] as they are, the thresholds
# those settings moved as rules on this model's own measurements (new_model_fields), and no
# threshold below the bundled card's own ([floors]).
NEW_MODEL = "new_model.toml"


@functools.cache
def new_model_presets() -> dict:
    """The new-model settings file, with its floors' values read from the card it names."""
    data = tomllib.loads((resources.files("entropix_mlx.data") / NEW_MODEL).read_text())
    card = read_toml(shipped_card(data["floors"]["card"]))["sampler"]
    return {**data, "floors": {k: card[k] for k in data["floors"]["fields"]}}


def new_model_floors() -> dict[str, float]:
    return dict(new_model_presets()["floors"])


ENTROPY_THRESHOLDS = ("low_entropy", "medium_entropy", "high_entropy")


def clip_to_vocabulary(fields: dict, vocabulary: int) -> tuple[dict, dict]:
    """(fields with every entropy threshold at most max_entropy(vocabulary), the
    original values of those clipped). A threshold above the maximum can never
    be crossed, so clipping it changes no decision."""
    top = max_entropy(vocabulary)
    clipped = {k: fields[k] for k in ENTROPY_THRESHOLDS if k in fields and fields[k] > top}
    return {**fields, **dict.fromkeys(clipped, top)}, clipped


def new_model_fields(found: dict, vocabulary: int | None) -> dict:
    """[sampler] for a model without a card: measured thresholds, raised to the
    floors, with the rules and settings of the new-model [sampler] table."""
    found = {**found, **{k: max(found[k], floor) for k, floor in new_model_floors().items()}}
    return {
        **found,
        "high_varentropy": found["low_varentropy"],
        "high_entropy": max_entropy(vocabulary) if vocabulary else found["high_entropy"],
        "thinking_text": SamplerConfig().thinking_text,
        **new_model_presets()["sampler"],
    }


def quantile_rules() -> dict[str, str]:
    return {k: f"{m} q{q:g}" for k, (m, q) in QUANTILES.items()}


def new_model_rules() -> dict[str, str]:
    """How new_model_fields sets each threshold, for the card's `thresholds_at`."""
    rules = quantile_rules()
    rules.update({k: f"{rules[k]}, at least {floor}" for k, floor in new_model_floors().items()})
    rules["high_varentropy"] = "low_varentropy"
    rules["high_entropy"] = "the vocabulary's maximum"
    rules["think_varentropy"] = "0 (think off)"
    return rules


def deliberate_table(found: dict) -> str:
    """[deliberate] for a model without a card: the new-model [deliberate] table, with the
    gate (used only if max_branch_points is raised) at this model's uncertain steps."""
    fields = {"branch_entropy": found["medium_entropy"], "branch_varentropy": found["high_varentropy"]}
    lines = [
        "# The `deliberate` sampler: the settings that won on GSM8K train items (docs/deliberate.md,",
        "# \"Per token spent\"); the gate's thresholds are this model's medium entropy and high varentropy.",
        "[deliberate]",
    ]
    return "\n".join(
        lines + [f"{k} = {toml_value(v)}" for k, v in {**new_model_presets()["deliberate"], **fields}.items()]
    )


def thresholds(samples: dict[str, np.ndarray], quantiles=QUANTILES) -> dict[str, float]:
    """Threshold values at the configured quantiles, kept in the order the
    config requires (low <= medium <= high)."""
    t = {
        name: float(np.quantile(samples[metric], q))
        for name, (metric, q) in quantiles.items()
        if name != "think_varentropy"
    }
    t["medium_entropy"] = max(t["medium_entropy"], t["low_entropy"])
    t["high_entropy"] = max(t["high_entropy"], t["medium_entropy"])
    t["high_varentropy"] = max(t["high_varentropy"], t["low_varentropy"])
    where = np.ones(len(samples["varentropy"]), dtype=bool)
    for m, op, field in threshold_condition("think_varentropy"):  # think's state: entropy > medium_entropy
        where &= COMPARE[op](samples[m], t[field])
    metric, q = quantiles["think_varentropy"]
    uncertain = samples[metric][where]
    t["think_varentropy"] = float(np.quantile(uncertain, q)) if len(uncertain) else t["low_varentropy"]
    return {k: round(v, 4) for k, v in t.items()}


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON string escapes are valid TOML
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to TOML")


OWN_TABLES = ("sampler", "calibration")


def other_tables(text: str) -> str:
    """The parts of an existing card that calibration does not write: every
    top-level table other than [sampler] and [calibration] (e.g. [tuning], a
    [deliberate] table), with its sub-tables and the comment lines just above
    its header, verbatim. Recalibrating must not drop them."""
    kept, block, keep, pending = [], [], False, []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("[") and not stripped.startswith("[["):
            top = stripped.strip("[]").split(".")[0].strip().strip('"')
            if keep:
                kept.extend(block)
            block, keep = pending + [line], top not in OWN_TABLES
            pending = []
        elif stripped.startswith("[["):  # an array-of-tables header: part of its block
            block += pending + [line]
            pending = []
        elif stripped.startswith("#") or not stripped:
            pending.append(line)  # may belong to the next header
        else:
            block += pending + [line]
            pending = []
    if keep:
        kept.extend(block + pending)
    return "\n".join(kept).strip("\n")


def card_text(
    model_name: str,
    samples: dict[str, np.ndarray],
    sampler_fields: dict,
    n_prompts: int,
    max_tokens: int,
    extra: str = "",
    vocabulary: int | None = None,
    clipped: dict | None = None,
    identity: str | None = None,
    rules: dict | None = None,
    model_path: str | None = None,
) -> str:
    lines = [
        f"# Model card for {model_name}: written by {'its first use' if identity else '`entropix-mlx calibrate`'}; "
        "[sampler] is read by the",
        "# Entropix sampler (thresholds in bits / bits^2). Edit thinking_text freely; recalibrating keeps it.",
        f"name = {toml_value(model_name)}",
        *([f"identity = {toml_value(identity)}  # the model this card was measured on"] if identity else []),
        *([f"source = {toml_value(model_path)}  # where that model was loaded from"] if model_path else []),
        "",
        "[sampler]",
        *(f"{k} = {toml_value(v)}" for k, v in sampler_fields.items()),
        "",
        "[calibration]",
        f"date = {toml_value(datetime.date.today().isoformat())}",
        f"prompts = {n_prompts}",
        f"max_tokens = {max_tokens}",
        f"steps = {len(samples['entropy'])}",
        "quantiles = " + toml_value(list(REPORTED_QUANTILES)),
        "thresholds_at = { "
        + ", ".join(f'{k} = "{rule}"' for k, rule in (rules or quantile_rules()).items())
        + " }"
        + ("" if rules else "  # think_varentropy: among steps with entropy > medium_entropy"),
    ]
    if vocabulary:
        lines.append(f"vocabulary = {vocabulary}  # tokens: entropy is at most {max_entropy(vocabulary)} bits")
    if clipped:
        lines.append(
            "clipped = "
            + "{ "
            + ", ".join(f"{k} = {toml_value(v)}" for k, v in clipped.items())
            + " }  # set above the largest entropy, lowered to it (no decision changes)"
        )
    lines += [
        "",
        "# The measured distribution of each metric, at the quantiles above.",
        "[calibration.metrics]",
    ]
    for name in METRIC_NAMES:
        values = [round(float(v), 4) for v in np.quantile(samples[name], REPORTED_QUANTILES)]
        lines.append(f"{name} = {toml_value(values)}")
    if extra:
        lines += ["", extra]
    return "\n".join(lines) + "\n"


def write_card(path, text: str) -> Path:
    """Replace the card atomically: a half-written card is never read."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, text)


def calibrate(
    model,
    tokenizer,
    model_name: str,
    out=None,
    prompts=PROMPTS,
    max_tokens: int = 24,
    seed: int = 0,
    samples: dict | None = None,
    progress=None,
    identity: str | None = None,
    model_path: str | None = None,
) -> tuple[Path, dict, dict]:
    """Measure, derive thresholds, write the card; returns (path, thresholds, samples).

    Settings already in an existing card other than the thresholds (e.g. its
    thinking_text, tuned strategy parameters) are kept, and so are its other
    tables ([tuning], [deliberate], ...). A new card starts from the new-model
    settings (entropix_mlx/data/new_model.toml). Entropy thresholds
    are clipped to the vocabulary's maximum, and the card says so."""

    path = Path(out) if out else shipped_card(model_name)
    if samples is None:
        samples = collect(model, tokenizer, prompts, max_tokens, seed, progress=progress)
    found = thresholds(samples)
    vocabulary = getattr(getattr(model, "args", None), "vocab_size", None)  # None: measured elsewhere
    try:
        old_text = path.read_text() if path.is_file() else None
        old = read_toml(path).get("sampler", {}) if old_text is not None else None
    except (OSError, UnicodeDecodeError, ConfigError):  # a corrupt card is replaced whole
        old_text = old = None
    if old is not None:
        kept = {k: v for k, v in SamplerConfig.current_names(old).items() if k not in found}
        fields, extra = {**found, "thinking_text": SamplerConfig().thinking_text, **kept}, other_tables(old_text)
        rules = None
    else:
        fields, extra, rules = new_model_fields(found, vocabulary), deliberate_table(found), new_model_rules()
    fields, clipped = clip_to_vocabulary(fields, vocabulary) if vocabulary else (fields, {})
    SamplerConfig().replace(**fields)  # never write a card the sampler would reject
    # A card written to a given path is rank 0's file; a user card (`identity`) is every rank's own: each rank's
    # sampler reads the card from its machine's cache, and every rank measured the same samples.
    if world().root or identity is not None:
        text = card_text(
            model_name,
            samples,
            fields,
            len(prompts),
            max_tokens,
            extra,
            vocabulary,
            clipped,
            identity,
            rules,
            model_path,
        )
        write_card(path, text)
    return path, found, samples
