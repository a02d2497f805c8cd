"""A self-contained HTML file of one answer: the CLI's HTML export and
the page's "Export answer" button write the same file (the template is also in
static/view.js, `exportHtml`): the page's style sheet and view script inline,
the tokens as JSON data, no network needed to open it."""

import json
from importlib import resources

from ..front import SAMPLER_NAMES
from ..sampling.config import THRESHOLDS, resolve_config
from ..sampling.recorder import recording
from .responses import record
from .strategies import page_info

STATIC = resources.files("entropix_mlx.server") / "static"


def info_for(model_name: str, sampler) -> dict:
    """The colours, legends and thresholds the view needs (as /v1/entropix/info)."""
    config = getattr(sampler, "config", None)
    if config is None:
        config, source = resolve_config(model_name)
    else:
        source = getattr(sampler, "config_source", "")
    return {
        **page_info(SAMPLER_NAMES, config),
        "thresholds": {k: getattr(config, k) for k in THRESHOLDS},
        "thresholds_from": source,
    }


def export_html(data: dict) -> str:
    """`data`: model, sampler, seed, messages ([{role, content}]), tokens
    (per-token JSON records, each with `alternatives`: [{token, logprob}]),
    summary (a line of text) and info (`info_for`)."""
    css = (STATIC / "style.css").read_text(encoding="utf-8")
    script = (STATIC / "view.js").read_text(encoding="utf-8")
    # view.js writes its closing tags as <\/script> so it can be inlined; keep it that way.
    assert "</script" not in script.lower(), "view.js would end its own inline <script>"
    payload = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")
    return (
        '<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<title>entropix-mlx answer</title>\n<style>\n{css}</style>\n</head>\n<body class="export">\n'
        f'<main id="export"></main>\n<script type="application/json" id="entropix-data">{payload}</script>\n'
        f'<script>\n{script}</script>\n<script>EntropixView.renderExport(document.getElementById("export"), '
        'JSON.parse(document.getElementById("entropix-data").textContent));</script>\n</body>\n</html>\n'
    )


class AnswerRecorder:
    """Collects one generation for `export_html`: wrap the sampler with
    `recorder.sampler` (it records each token's top alternatives), `add` each
    TokenEvent, then `html(...)`."""

    ALTERNATIVES = 5

    def __init__(self, sampler, tokenizer):
        self.chooser = sampler
        self.sampler = recording(sampler, self.ALTERNATIVES)
        self.tokenizer = tokenizer
        self.tokens: list[dict] = []

    def add(self, event):
        alternatives = [{"token": self.tokenizer.decode([t]), "logprob": lp} for t, lp in event.top]
        self.tokens.append({**record(event), "alternatives": alternatives})

    def html(self, model_name: str, seed: int, messages: list[dict], summary: str) -> str:
        return export_html(
            {
                "model": model_name,
                "sampler": self.chooser.name,
                "seed": seed,
                "messages": messages,
                "tokens": self.tokens,
                "summary": summary,
                "info": info_for(model_name, self.chooser),
            }
        )
