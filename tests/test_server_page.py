"""The page at `/` in a real headless browser (the distribution's Chromium,
driven by Playwright): streamed tokens carrying their strategy, the legend, the
chart, the hover details, the export; and `run --html`, the same file."""

import re
import sys

import pytest
from conftest import SHELF
from playwright.sync_api import sync_playwright
from serving import CHROMIUM_ARGS, KEY, app_on_a_port, chromium_path, running_server
from test_deliberate_cli import LONG, QUESTION, assert_rule_reads_table, deliberate_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("serve") / "serve.log", "--api-key", KEY) as s:
        yield s


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=chromium_path(),
            args=CHROMIUM_ARGS,
            headless=True,
            viewport={"width": 1100, "height": 760},
            accept_downloads=True,
        )
        yield context
        context.close()


def rgb(hex_color: str) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def check_tooltip(page, token):
    token.hover()
    tip = page.locator("#tooltip, .tooltip").first
    tip.wait_for(state="visible")
    text = tip.inner_text()
    for word in ("logprob", "entropy", "varentropy", "attn_entropy", "interaction_strength", "top alternatives"):
        assert word in text
    assert token.get_attribute("data-strategy") in text


def wait_until_answered(page):
    """Until the last answer's status line says how it stopped."""
    page.wait_for_function(
        "() => /stopped: /.test(document.querySelector('.msg.assistant:last-child .status')?.textContent)",
        timeout=120_000,
    )


def open_page(server, browser):
    """The page, its legend shown (the API key typed in if the browser's profile lacks it)."""
    page = browser.new_page()
    page.goto(server[0] + "/")
    page.locator("#legend .entry, #key-label:not([hidden])").first.wait_for()
    if page.locator("#api-key").is_visible():
        page.fill("#api-key", KEY)
        page.dispatch_event("#api-key", "change")
    page.locator("#legend .entry").first.wait_for()
    return page


@pytest.fixture(scope="module")
def answered(server, browser, tmp_path_factory):
    """The page after one streamed answer: (page, token counts seen while streaming)."""
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # Every request must stay on this server: the page works offline (no CDN).
    outside = []
    page.route(
        re.compile(r"^(?!http://127\.0\.0\.1:%d/).*" % server[1]),
        lambda route: (outside.append(route.request.url), route.abort()),
    )
    page.goto(server[0] + "/")
    page.locator("#key-label").wait_for(state="visible")  # the server wants a key: the page asks for it
    page.fill("#api-key", KEY)
    page.dispatch_event("#api-key", "change")
    page.locator("#legend .entry").first.wait_for()
    assert page.locator("#notice").is_hidden()
    page.evaluate("""() => { window.tokenCounts = [];
        new MutationObserver(() => window.tokenCounts.push(document.querySelectorAll('.tok').length))
          .observe(document.getElementById('chat'), {childList: true, subtree: true}); }""")
    page.fill("#max-tokens", "10")
    page.fill("#seed", "3")
    page.fill("#prompt", "Why is the sky blue?")
    page.click("#send")
    wait_until_answered(page)
    counts = page.evaluate("window.tokenCounts")
    assert not errors and not outside
    yield page, counts


def test_tokens_stream_in_with_their_strategy_colour(answered):
    page, counts = answered
    tokens = page.locator(".msg.assistant .tok")
    assert tokens.count() == 10
    assert len({c for c in counts if c}) > 1  # tokens appeared one by one, not all at the end
    legend = page.locator("#legend .entry")
    legend_names = [legend.nth(i).get_attribute("data-strategy") for i in range(legend.count())]
    # The served card's strategies, as the terminal's legend lists them (it switches some off).
    from entropix_mlx.sampling.config import resolve_config

    enabled = set(resolve_config("smollm2-135m")[0].strategies) | {"adaptive"}
    assert legend_names == [s for s in ["argmax", "think", "branch", "resample", "adaptive"] if s in enabled]
    assert "argmax" in legend_names and "adaptive" in legend_names
    info = page.evaluate(
        f"fetch('/v1/entropix/info', {{headers: {{Authorization: 'Bearer {KEY}'}}}}).then(r => r.json())"
    )
    for i in range(tokens.count()):
        strategy = tokens.nth(i).get_attribute("data-strategy")
        assert strategy in legend_names
        color = tokens.nth(i).evaluate("e => getComputedStyle(e).color")
        assert color == rgb(info["colors"][strategy])
    # The terminal's colours: run.svg's theme, e.g. argmax is its text colour (rich's "default").
    assert info["colors"]["argmax"] == "#c5c8c6"


def test_chart_shows_entropy_varentropy_and_thresholds(answered):
    page, _ = answered
    chart = page.locator(".msg.assistant svg.chart")
    for series in ("entropy", "varentropy"):
        points = chart.locator(f"polyline[data-series={series}]").get_attribute("points").split()
        assert len(points) == 10
    drawn = {
        chart.locator("line[data-threshold]").nth(i).get_attribute("data-threshold")
        for i in range(chart.locator("line[data-threshold]").count())
    }
    assert {"low_entropy", "medium_entropy", "high_entropy", "low_varentropy", "high_varentropy"} <= drawn


def test_hover_shows_metrics_and_alternatives(answered, tmp_path):
    page, _ = answered
    check_tooltip(page, page.locator(".msg.assistant .tok").first)  # the first token of a decision has alternatives
    shot = tmp_path / "server.png"
    page.screenshot(path=str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_export_is_a_self_contained_page(answered, browser, tmp_path):
    page, _ = answered
    with page.expect_download() as download:
        page.click("#export")
    path = tmp_path / "answer.html"
    download.value.save_as(str(path))
    html = path.read_text()
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")  # nothing to fetch
    view = browser.new_page()
    view.route("**/*", lambda route: route.abort() if not route.request.url.startswith("file:") else route.continue_())
    view.goto(path.as_uri())
    tokens = view.locator(".tok")
    assert tokens.count() == page.locator(".msg.assistant .tok").count()
    assert view.locator("svg.chart polyline[data-series=entropy]").count() == 1
    check_tooltip(view, tokens.first)
    view.close()


def test_page_export_and_run_html_write_the_same_file(answered):
    from entropix_mlx.server.export import STATIC, export_html

    page, _ = answered
    data = {
        "model": "m",
        "sampler": "entropix",
        "seed": 3,
        "summary": "s </script> <b>",
        "messages": [{"role": "user", "content": "é <script>alert(1)</script>"}],
        "tokens": [
            {
                "token": 1,
                "text": " a\n",
                "strategy": "argmax",
                "entropy": 0.25,
                "logprob": -0.5,
                "alternatives": [{"token": "<", "logprob": -1.5}],
            }
        ],
        "info": {"colors": {"argmax": "#98a84b"}, "thresholds": {"low_entropy": 0.5}},
    }
    css, script = (STATIC / "style.css").read_text(), (STATIC / "view.js").read_text()
    from_page = page.evaluate(
        "([css, script, data]) => EntropixView.exportHtml(css, script, data)", [css, script, data]
    )
    assert from_page == export_html(data)


def test_run_html_writes_the_same_kind_of_page(browser, tmp_path):
    from entropix_mlx.cli.app import main

    path = tmp_path / "run.html"
    with pytest.raises(SystemExit) as exit_:
        main(
            ["run", "What is 2+2?", "--sampler", "greedy", "--max-tokens", "5", "--html", str(path), "--no-color"],
            shelf=SHELF,
        )
    sys.stdout.flush()
    assert exit_.value.code == 0
    view = browser.new_page()
    view.goto(path.as_uri())
    tokens = view.locator(".tok")
    assert tokens.count() == 5
    assert {tokens.nth(i).get_attribute("data-strategy") for i in range(5)} == {"argmax"}
    assert view.locator("#export .legend .entry").count() == 1
    check_tooltip(view, tokens.first)
    view.close()


def test_run_html_refuses_a_missing_folder(tmp_path, capsys):
    from entropix_mlx.cli.app import main

    with pytest.raises(SystemExit) as exit_:
        main(["run", "Hi", "--html", str(tmp_path / "nope" / "a.html")], shelf=SHELF)
    assert exit_.value.code == 2
    assert "folder does not exist" in capsys.readouterr().err


def test_a_second_turn_reuses_the_cached_conversation(answered):
    page, _ = answered
    first = page.locator(".msg.assistant").count()
    page.fill("#max-tokens", "4")
    page.fill("#prompt", "And why is it red at sunset?")
    page.click("#send")
    page.wait_for_function(
        f"() => document.querySelectorAll('.msg.assistant').length > {first} && "
        "/stopped: /.test(document.querySelector('.msg.assistant:last-child .status')?.textContent)",
        timeout=120_000,
    )

    def counts(status):
        return tuple(map(int, re.search(r"prompt (\d+) \(cached (\d+)\)", status.inner_text()).groups()))

    first_prompt, _ = counts(page.locator(".msg.assistant .status").first)
    prompt, cached = counts(page.locator(".msg.assistant:last-child .status"))
    assert first_prompt <= cached < prompt  # the first turn was not prefilled again
    assert page.locator(".msg.assistant:last-child .tok").count() == 4


def test_the_seed_shown_reproduces_the_answer(server, browser):
    """Seeds go up to 2^63: the page shows the exact seed the server used (not a
    JavaScript number's rounding of it), and typing it back gives the same answer."""
    page = open_page(server, browser)
    page.select_option("#sampler", "temperature")
    page.fill("#max-tokens", "12")

    def answer(seed: str) -> tuple[str, str]:
        page.fill("#seed", seed)
        page.fill("#prompt", "Tell me a story.")
        page.click("#send")
        wait_until_answered(page)
        status = page.locator(".msg.assistant:last-child .status").inner_text()
        text = "".join(page.locator(".msg.assistant:last-child .tok").all_inner_texts())
        page.click("#new-chat")
        return re.search(r"seed (\d+)", status).group(1), text

    chosen = str(2**63 - 12345)  # well past 2^53
    shown, first = answer(chosen)
    assert shown == chosen
    drawn, second = answer("")  # the server draws one
    assert int(drawn) < 2**63
    again_seed, again = answer(drawn)
    assert again_seed == drawn and again == second
    page.close()


def test_the_page_names_its_icon_and_an_empty_chart_names_no_token_0(server, browser):
    page = browser.new_page()
    page.goto(server[0] + "/")
    # An inline icon: without one, browsers ask for /favicon.ico, a 404 on every load.
    assert page.locator('link[rel="icon"]').get_attribute("href") == "data:,"
    labels = page.evaluate(
        """() => { const svg = document.createElementNS('http://www.w3.org/2000/svg', 'svg');
        return [[], [{entropy: 1, varentropy: 2}], [{entropy: 1, varentropy: 2}, {entropy: 2, varentropy: 1}]]
          .map((tokens) => { EntropixView.chart(svg, tokens, {}); return [...svg.querySelectorAll('text')]
            .map((t) => t.textContent).filter((t) => t.startsWith('token')); }); }"""
    )
    assert labels == [["token 1"], ["token 1"], ["token 1", "token 2"]]  # no "token 0" while it starts
    page.close()


CARD = {"low_entropy": 1.9112, "low_varentropy": 6.3016, "medium_entropy": 3.3035, "high_entropy": 20.0}


@pytest.mark.parametrize(
    "thresholds",
    [
        {**CARD, "high_varentropy": 6.3016},  # the bundled card: two at 6.3, high_entropy at the top
        dict.fromkeys(["low_entropy", "medium_entropy", "high_entropy", "low_varentropy", "high_varentropy"], 2.0),
        {"low_entropy": 0.0, "medium_entropy": 0.05, "high_entropy": 0.1, "high_varentropy": 9.9},
    ],
)
def test_chart_labels_never_overlap_and_no_line_crosses_the_legend(browser, thresholds):
    """Every text of the chart (axis labels, threshold labels, the series'
    legend) has a box of its own inside the chart, and no threshold line runs
    through the series' legend."""
    from entropix_mlx.server.export import STATIC

    page = browser.new_page()
    css, script = (STATIC / "style.css").read_text(), (STATIC / "view.js").read_text()
    page.set_content(f"<style>{css}</style><svg class='chart' id='c'></svg><script>{script}</script>")
    tokens = [{"entropy": (i % 7) / 2, "varentropy": (i % 5) * 2} for i in range(40)]
    boxes = page.evaluate(
        """([tokens, thresholds]) => { const svg = document.getElementById('c');
        EntropixView.chart(svg, tokens, thresholds);
        const box = (e) => { const b = e.getBBox(); return [b.x, b.y, b.x + b.width, b.y + b.height, e.textContent]; };
        return { texts: [...svg.querySelectorAll('text')].map(box),
                 lines: [...svg.querySelectorAll('line[data-threshold]')].map((l) => [+l.getAttribute('x1'),
                   +l.getAttribute('y1'), +l.getAttribute('x2'), l.dataset.threshold]) }; }""",
        [tokens, thresholds],
    )
    texts = boxes["texts"]
    # a label per value of each metric's thresholds, naming every threshold at it
    shown = {(name.split("_")[1], f"{v:.2f}") for name, v in thresholds.items()}
    threshold_labels = [t[4] for t in texts if "_" in t[4]]
    assert len(threshold_labels) == len(shown)
    for name in thresholds:  # "high_entropy 20", or "low/high_varentropy 6.3" for two at one value
        level, metric = name.split("_", 1)
        assert any(level in label.split("_")[0].split("/") and f"_{metric} " in label for label in threshold_labels)
    if thresholds.get("low_varentropy") == thresholds.get("high_varentropy"):
        assert any(label.startswith("low/high_varentropy ") for label in threshold_labels)
    for a, b in ((a, b) for i, a in enumerate(texts) for b in texts[i + 1 :]):
        assert a[2] <= b[0] or b[2] <= a[0] or a[3] <= b[1] or b[3] <= a[1], (a[4], b[4])
    for x0, y0, x1, y1, text in texts:
        assert 0 <= x0 and x1 <= 980 and 0 <= y0 and y1 <= 190, text
    legend = [t for t in texts if t[4].startswith("—")]
    assert len(legend) == 2
    for lx0, ly, lx1, name in boxes["lines"]:
        for x0, y0, x1, y1, text in legend:
            assert not (y0 <= ly <= y1 and lx0 <= x1 and x0 <= lx1), (name, text)
    page.close()


def test_the_empty_page_says_what_to_do_until_the_first_answer(server, browser):
    page = open_page(server, browser)
    hint = page.locator("#hint")
    assert hint.is_visible() and "question" in hint.inner_text() and "hover" in hint.inner_text()
    page.fill("#max-tokens", "2")
    page.fill("#prompt", "Hi")
    page.click("#send")
    wait_until_answered(page)
    assert hint.is_hidden()
    page.click("#new-chat")
    assert hint.is_visible()  # a new chat is an empty page again
    page.close()


def test_a_json_answer_shades_each_value_by_how_unsure_the_model_was(server, browser):
    page = open_page(server, browser)
    page.check("#json-answer")
    page.fill("#max-tokens", "60")
    page.fill("#prompt", "Extract the facts as JSON: Ada Lovelace, 36, lives in London.")
    page.click("#send")
    wait_until_answered(page)
    last = page.locator(".msg.assistant:last-child")
    text = "".join(last.locator(".tok").all_inner_texts())
    assert text.startswith("{")  # (the answer may run past max tokens: its complete values are shaded)
    shaded = last.locator(".tok.field")
    assert shaded.count() > 0
    paths = {shaded.nth(i).get_attribute("data-field") for i in range(shaded.count())}
    assert len(paths) >= 2 and all(p.startswith("/") for p in paths)
    shades = {shaded.nth(i).evaluate("s => s.style.background") for i in range(shaded.count())}
    assert len(shades) > 1  # the values are not all equally sure
    assert "lowest" in shaded.first.get_attribute("title")
    assert last.locator(".fields [data-field]").count() == len(paths)
    page.close()


# (the card's selector and margin, greedy's answer, a branch's, the verdict): test_deliberate_cli's cases.
PAGE_CASES = [("vote", 0.0, "12", LONG, "won"), ("vote", 5.0, "12", LONG, "kept")]


@pytest.mark.parametrize("selector, margin, mine, theirs, verdict", PAGE_CASES)
def test_deliberates_table_and_rule_line_on_the_page_read_the_same_numbers(
    browser, tiny_ref, tmp_path, answers, selector, margin, mine, theirs, verdict
):
    from dataclasses import replace

    from entropix_mlx.front import ModelCard
    from entropix_mlx.server import Engine, PrefixCache

    answers(QUESTION, mine, theirs)
    loaded = SHELF.loaded[(tiny_ref, "auto")]
    card = ModelCard("tiny", deliberate_config(tmp_path, selector, margin), "user", loaded.tokenizer)
    with app_on_a_port(Engine(replace(loaded, card=card), PrefixCache(4, 4096))) as port:
        page = open_page((f"http://127.0.0.1:{port}", port), browser)
        page.select_option("#sampler", "deliberate")
        page.fill("#max-tokens", "6")
        page.fill("#prompt", QUESTION)
        page.click("#send")
        wait_until_answered(page)
        box = page.locator(".msg.assistant:last-child .deliberation")
        rows = box.locator("tr").evaluate_all(
            """rows => rows.slice(1).map((r) => ({
                 chosen: r.classList.contains("chosen"),
                 candidate: r.querySelector("[data-column=candidate]").textContent.replace(" (chosen)", ""),
                 answer: r.querySelector("[data-column=answer]").textContent,
                 score: r.querySelector("[data-column=score]").textContent,
                 cut: r.querySelector("[data-column=answer]").scrollWidth
                      > r.querySelector("[data-column=answer]").clientWidth }))"""
        )
        rule = box.locator(".rule").inner_text()
        page.close()
    for r in rows:
        r["score"] = float(r["score"]) if r["score"] else None
    assert len(rows) == 4 and rule.startswith("rule: ")
    assert assert_rule_reads_table(rule.removeprefix("rule: "), rows) == verdict
    assert [r["cut"] for r in rows] == [False, True, True, True]  # a long answer is cut to its column
