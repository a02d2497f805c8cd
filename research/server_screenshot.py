"""Regenerate docs/server.png: the page of `entropix-mlx serve` on the bundled
model, in Debian's Chromium driven by Playwright, one answer streamed and one
token hovered.

    python -m research.server_screenshot
"""

import tempfile
from pathlib import Path

from playwright.sync_api import sync_playwright

from tests.serving import CHROMIUM_ARGS, chromium_path, running_server  # noqa: E402

PROMPT = "Why is the sky blue?"

with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp) / "serve.log") as (url, _), sync_playwright() as p:
    context = p.chromium.launch_persistent_context(
        str(Path(tmp) / "profile"),
        executable_path=chromium_path(),
        args=CHROMIUM_ARGS,
        headless=True,
        viewport={"width": 1100, "height": 720},
        device_scale_factor=1,
    )
    page = context.new_page()
    page.goto(url + "/")
    page.locator("#legend .entry").first.wait_for()
    page.fill("#max-tokens", "48")
    page.fill("#seed", "0")
    page.fill("#prompt", PROMPT)
    page.click("#send")
    page.wait_for_function(
        "() => /stopped: /.test(document.querySelector('.msg.assistant:last-child .status')?.textContent)",
        timeout=300_000,
    )
    page.locator(".msg.assistant .tok").nth(1).hover()
    page.screenshot(path=str(Path(__file__).resolve().parents[1] / "docs" / "server.png"))
    context.close()
