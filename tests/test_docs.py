"""Docs that cannot drift from the code: every command and option of `--help`
is in docs/cli.md, the README lists every doc, and a preset written out as a
--config table matches the preset."""

import re
from pathlib import Path

import pytest
import typer
from entropix_mlx.cli.app import app, register_commands

ROOT = Path(__file__).resolve().parents[1]


def test_every_command_and_option_is_in_docs_cli():
    register_commands()
    doc = (ROOT / "docs" / "cli.md").read_text()
    missing = []
    for name, command in typer.main.get_command(app).commands.items():
        if f"\n## {name}\n" not in doc:
            missing.append(f"command {name}")
        for param in command.params:
            missing += [
                f"{name} {o}" for o in param.opts if o.startswith("--") and o != "--help" and f"`{o}" not in doc
            ]
    assert not missing, f"not in docs/cli.md: {', '.join(missing)}"


def test_the_readme_lists_every_doc():
    readme = (ROOT / "README.md").read_text()
    unlisted = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"(docs/{p.name})" not in readme]
    assert not unlisted, f"README.md does not list {', '.join(unlisted)}"


@pytest.mark.slow
def test_help_wraps_to_the_terminal_and_names_arguments_plainly(monkeypatch):
    from test_cli_run import invoke

    def help_text(command, columns):
        monkeypatch.setenv("COLUMNS", str(columns))  # Rich reads the width when the help is printed
        code, out, _ = invoke(command, "--help")
        assert code == 0
        return out

    for command in ("run", "calibrate", "eval", "convert"):
        lines = help_text(command, 70).splitlines()
        assert all(len(line) <= 70 for line in lines), command
        start = next(i for i, line in enumerate(lines) if "Usage:" in line)
        usage = " ".join(lines[start : next(i for i in range(start, len(lines)) if not lines[i].strip())])
        arguments = usage.split("[OPTIONS]")[1].replace("[", "").replace("]", "").strip()
        assert "{" not in usage and arguments == arguments.upper(), usage
    # the calibrate summary is one paragraph, wrapped where the terminal is, not where the source was
    assert "(seconds to a minute: 16 short answers in one batch); --tune also chooses" in help_text("calibrate", 200)


def test_no_library_module_names_a_cli_flag():
    """The library names settings; the CLI maps them to its flags (cli/app.py FLAGS)."""
    register_commands()
    flags = {
        o
        for command in typer.main.get_command(app).commands.values()
        for param in command.params
        for o in param.opts
        if o.startswith("--") and o != "--help"
    }
    found = []
    for path in sorted((ROOT / "entropix_mlx").rglob("*.py")):
        if path.name == "make_builtin.py":  # a generator script with a command line of its own
            continue
        text = path.read_text()
        found += [f"{path.relative_to(ROOT)}: {flag}" for flag in flags if re.search(rf"{flag}(?![\w-])", text)]
    assert not found, "\n".join(found)


def test_the_cli_names_its_flag_where_the_library_names_a_setting():
    from test_cli_run import invoke

    code, _, err = invoke("eval", "--builtin", "--split", "nope")
    assert code == 2 and "--split 'nope'" in err


def test_the_results_speed_figures_come_from_docs_speed():
    """One source for each figure: every number of docs/results.md's speed part is on docs/speed.md."""
    results = (ROOT / "docs" / "results.md").read_text()
    part = results[results.index("\n## Speed\n") :]
    speed = (ROOT / "docs" / "speed.md").read_text()
    figures = set(re.findall(r"\d+\.\d+", part))
    assert len(figures) > 20
    missing = sorted(f for f in figures if f not in speed)
    assert not missing, f"docs/results.md speed figures not on docs/speed.md: {missing}"


def test_the_readme_is_short_and_names_no_path_outside_the_repository():
    """A clone is all a reader has: no `../` path, no file of the development machines' shared/data."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 350
    outside = [line for line in readme.splitlines() if "../" in line or "shared/data" in line]
    assert not outside, "README.md names paths outside the repository:\n" + "\n".join(outside)


def prose(path: Path) -> list[str]:
    """A page's lines outside its code blocks."""
    lines, fenced = [], False
    for line in path.read_text().splitlines():
        fenced ^= line.startswith("```")
        lines += [] if fenced or line.startswith("```") else [line]
    return lines


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    anchors, seen = set(), {}
    for line in prose(path):
        if m := re.match(r"#+\s+(.*)", line):
            anchor = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n, seen[anchor] = seen.get(anchor, 0), seen.get(anchor, 0) + 1
            anchors.add(anchor if n == 0 else f"{anchor}-{n}")
    return anchors


def test_every_link_in_the_readme_and_docs_leads_somewhere():
    """A relative link names a file of the repository, and a `#part` a heading of that page."""
    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", "\n".join(prose(page))):
            if re.match(r"[a-z]+:", target):  # https:, mailto:, data:
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.is_relative_to(ROOT) or not file.exists():
                broken.append(f"{page.name}: {target} (no such file in the repository)")
            elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_staged_config_in_docs_is_the_preset():
    """docs/deliberate.md gives run/chat/serve the deliberate_staged preset as a --config table."""
    import tomllib

    from entropix_mlx.front.registry import SAMPLERS

    doc = (ROOT / "docs" / "deliberate.md").read_text()
    block = re.search(r"```toml\n(\[deliberate\]\s+# deliberate_staged\n.*?)```", doc, re.S)
    assert block, "docs/deliberate.md has no [deliberate] table for deliberate_staged"
    assert tomllib.loads(block.group(1))["deliberate"] == SAMPLERS["deliberate_staged"].rule
