"""The package's shape: no import circles, no reaching into another module's
private names, short modules, and no terminal code in the library.

The walker reads the source with `ast` (nothing is imported), so it sees every
import: at module level, inside functions, under `if TYPE_CHECKING:`."""

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# cli/ installs as entropix_mlx.cli (pyproject.toml's package-dir).
PACKAGE_DIRS = {"entropix_mlx": ROOT / "entropix_mlx", "entropix_mlx.cli": ROOT / "cli"}
MAX_LINES = 400
TERMINAL_PACKAGES = ("entropix_mlx.cli", "rich", "typer")
# `python -m entropix_mlx` starts the terminal app: the one library file that may import it.
CLI_ENTRY = "entropix_mlx.__main__"


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    imports: set[str] = field(default_factory=set)  # every module it imports, dotted, resolved
    private: list[str] = field(default_factory=list)  # "line N: from X import _y"


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def find_modules(package_dirs: dict[str, Path]) -> dict[str, Module]:
    modules = {}
    for package, directory in package_dirs.items():
        for path in sorted(directory.rglob("*.py")):
            parts = [package, *path.relative_to(directory).with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            modules[name] = Module(name, path, is_package)
    return modules


def _absolute(module: Module, level: int, target: str | None) -> str:
    """The absolute name of `from <dots><target> import ...` in `module`."""
    if level == 0:
        return target or ""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    base = package.split(".")
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def walk(package_dirs: dict[str, Path]) -> dict[str, Module]:
    """Every module of the packages with the package modules it imports (only
    modules of the packages; `from pkg import name` counts as importing
    pkg.name when that is a module, else pkg) and the private names it takes
    from them (imported, or read as an attribute of an imported module)."""
    modules = find_modules(package_dirs)
    for module in modules.values():
        tree = ast.parse(module.path.read_text(encoding="utf-8"), str(module.path))
        bound = {}  # local name -> package module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        module.imports.add(alias.name)
                        if alias.asname:
                            bound[alias.asname] = alias.name
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(module, node.level, node.module)
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    if full in modules:
                        module.imports.add(full)
                        bound[alias.asname or alias.name] = full
                    elif source in modules:
                        module.imports.add(source)
                        if is_private(alias.name):
                            module.private.append(f"line {node.lineno}: from {source} import {alias.name}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound
                and is_private(node.attr)
            ):
                module.private.append(f"line {node.lineno}: {bound[node.value.id]}.{node.attr}")
        module.imports.discard(module.name)
    return modules


def import_circles(modules: dict[str, Module]) -> list[list[str]]:
    """One shortest circle through each group of modules that import each other
    (Tarjan's strongly connected components, then a breadth-first search)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def connect(name):
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for other in sorted(modules[name].imports):
            if other not in index:
                connect(other)
                low[name] = min(low[name], low[other])
            elif other in on_stack:
                low[name] = min(low[name], index[other])
        if low[name] == index[name]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == name:
                    break
            if len(group) > 1:
                groups.append(group)

    for name in sorted(modules):
        if name not in index:
            connect(name)
    return sorted(shortest_circle(modules, group) for group in groups)


def shortest_circle(modules: dict[str, Module], group: set[str]) -> list[str]:
    """A shortest circle through the group's first module (breadth-first)."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        name = queue.pop(0)
        for other in sorted(modules[name].imports & group):
            if other == start:
                return paths[name] + [start]
            if other not in paths:
                paths[other] = paths[name] + [other]
                queue.append(other)
    return [start]  # not reached: a strongly connected group has a circle through every member


def chain(circle: list[str]) -> str:
    return " -> ".join(circle)


@pytest.fixture(scope="module")
def package():
    return walk(PACKAGE_DIRS)


def test_no_import_circles(package):
    circles = import_circles(package)
    if circles:
        pytest.fail("import circles (counting imports inside functions):\n" + "\n".join(map(chain, circles)), False)


def test_no_module_imports_private_names_of_another(package):
    found = [f"{m.name} {use}" for m in package.values() for use in m.private]
    if found:
        pytest.fail("modules use another module's _private names:\n" + "\n".join(found), False)


def test_modules_are_short(package):
    long = {m.path.relative_to(ROOT): len(m.path.read_text(encoding="utf-8").splitlines()) for m in package.values()}
    long = {path: n for path, n in long.items() if n > MAX_LINES}
    if long:
        pytest.fail(
            f"modules over {MAX_LINES} lines: " + ", ".join(f"{p} ({n})" for p, n in sorted(long.items())), False
        )


def test_library_has_no_terminal_code(package):
    found = []
    for m in package.values():
        if m.name.startswith("entropix_mlx.cli") or m.name == CLI_ENTRY:
            continue
        tree = ast.parse(m.path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                source = _absolute(m, node.level, node.module)
                names = [source] + [f"{source}.{a.name}" for a in node.names]
            else:
                continue
            if any(n == p or n.startswith(p + ".") for n in names for p in TERMINAL_PACKAGES):
                found.append(f"{m.name} line {node.lineno}: {ast.unparse(node)}")
    if found:
        pytest.fail("the library imports terminal code (cli, rich, typer):\n" + "\n".join(found), False)


# The packages in layers, lowest first: each may import only the ones before it
# (and the top-level modules errors and files), so no concept reaches up.
LAYERS = ("accel", "model", "sampling", "decode", "front", ("eval", "server"))


def layer_of(name: str) -> int | None:
    parts = name.split(".")
    if len(parts) < 2:
        return None
    for i, layer in enumerate(LAYERS):
        if parts[1] in ((layer,) if isinstance(layer, str) else layer):
            return i
    return None


def test_packages_import_only_the_layers_below_them(package):
    found = []
    for m in package.values():
        mine = layer_of(m.name)
        if mine is None:
            continue
        for target in sorted(m.imports):
            theirs = layer_of(target) if target.startswith("entropix_mlx.") else None
            if theirs is not None and (
                theirs > mine or (theirs == mine and target.split(".")[1] != m.name.split(".")[1])
            ):
                found.append(f"{m.name} imports {target}")
    if found:
        pytest.fail(
            "a package imports one above or beside it (" + " < ".join(map(str, LAYERS)) + "):\n" + "\n".join(found),
            False,
        )


# What builds a sampler or prepares a request. The CLI, the server and eval reach them only
# through the front door (entropix_mlx.front): `LoadedModel.sampler` / `prepare` / `generate`,
# or `registry.build` for a model they hold no `LoadedModel` of (bench, profile).
SAMPLER_MAKERS = {
    "entropix_mlx.sampling.entropix": "EntropixSampler",
    "entropix_mlx.sampling.samplers": ("GreedySampler", "TemperatureSampler", "MinPSampler"),
    "entropix_mlx.decode.deliberate": "Deliberator",
    "entropix_mlx.decode.voting": "Voter",
    "entropix_mlx.decode.generate": "generate",
    "entropix_mlx.sampling.penalties": "make_penalties",
}
FRONT_USERS = ("entropix_mlx.cli", "entropix_mlx.server", "entropix_mlx.eval")
# Eval's own measurements, which run a bare sampler on purpose (calibration, tuning, bench baselines).
MEASURING = ("entropix_mlx.eval.measure", "entropix_mlx.eval.tune", "entropix_mlx.eval.bench")


def imported_names(module: Module) -> set[tuple[str, str]]:
    """(module, name) for each `from module import name` in `module`'s source."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"))
    return {
        (_absolute(module, node.level, node.module), alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def test_the_cli_the_server_and_eval_make_samplers_only_through_the_front_door(package):
    found = []
    for m in package.values():
        if not m.name.startswith(FRONT_USERS) or m.name in MEASURING:
            continue
        for source, name in imported_names(m):
            makers = SAMPLER_MAKERS.get(source, ())
            if name in ((makers,) if isinstance(makers, str) else makers):
                found.append(f"{m.name} imports {source}.{name}")
    assert not found, "\n".join(found)


# A sampler's settings class is the registry's to know: the CLI asks the registry (a spec's
# `table`, `presets`, `votes`; `config_sets`, `read_settings`), never which class it holds.
SETTINGS_CLASSES = {
    "entropix_mlx.sampling.config": "SamplerConfig",
    "entropix_mlx.sampling.deliberate_config": "DeliberateConfig",
    "entropix_mlx.sampling.voting": "VoteConfig",
}


def test_the_cli_asks_the_registry_never_a_settings_class(package):
    found = [
        f"{m.name} imports {source}.{name}"
        for m in package.values()
        if m.name.startswith("entropix_mlx.cli")
        for source, name in imported_names(m)
        if SETTINGS_CLASSES.get(source) == name
    ]
    found += [
        f"{m.name} line {node.lineno}: {ast.unparse(node)}"
        for m in package.values()
        if m.name.startswith("entropix_mlx.cli")
        for node in ast.walk(ast.parse(m.path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute) and node.attr == "settings" and "spec" in ast.unparse(node.value)
    ]
    assert not found, "\n".join(found)


def test_sampler_names_are_compared_only_in_the_registry():
    names = "|".join(["entropix", "deliberate", "greedy", "min_p", "temperature", "self_consistency", "cisc"])
    pattern = re.compile(rf"""(==|!=)\s*["']({names})["']|["']({names})["']\s*(==|!=|in\b|not in\b)""")
    found = []
    for directory in (ROOT / "entropix_mlx", ROOT / "cli"):
        for path in sorted(directory.rglob("*.py")):
            if path.relative_to(ROOT).as_posix() == "entropix_mlx/front/registry.py":
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_walker_of_sampler_makers_catches_a_direct_import(tmp_path):
    modules = plant(tmp_path, {"__init__.py": "", "a.py": "from .b import GreedySampler, other\n", "b.py": ""})
    assert imported_names(modules["pkg.a"]) == {("pkg.b", "GreedySampler"), ("pkg.b", "other")}


def test_walker_sees_all_modules(package):
    assert {"entropix_mlx", "entropix_mlx.cli.render", "entropix_mlx.decode.engine", CLI_ENTRY} <= set(package)
    assert "entropix_mlx.errors" in package["entropix_mlx.model.loading"].imports


# The walker on a planted package: what it must catch.


def plant(tmp_path, files: dict[str, str]) -> dict[str, Module]:
    for rel, text in files.items():
        path = tmp_path / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return walk({"pkg": tmp_path / "pkg"})


def test_walker_finds_a_circle_through_a_function_import(tmp_path):
    modules = plant(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from .sub import b\n",
            "sub/__init__.py": "",
            "sub/b.py": "import pkg.c\n",
            "sub/d.py": "from ..a import thing\n",  # d -> a, but nothing imports d: no circle
            "c.py": "def f():\n    from . import a\n",
        },
    )
    assert import_circles(modules) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]
    assert chain(import_circles(modules)[0]) == "pkg.a -> pkg.sub.b -> pkg.c -> pkg.a"


def test_walker_finds_a_circle_under_type_checking(tmp_path):
    modules = plant(
        tmp_path,
        {
            "__init__.py": "",
            "x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .y import Y\n",
            "y.py": "from .x import helper\n",
        },
    )
    assert import_circles(modules) == [["pkg.x", "pkg.y", "pkg.x"]]


def test_walker_passes_a_package_without_circles(tmp_path):
    modules = plant(
        tmp_path,
        {"__init__.py": "from .a import f\n", "a.py": "from .b import g\n", "b.py": "import os\nimport json\n"},
    )
    assert import_circles(modules) == []
    assert modules["pkg.a"].imports == {"pkg.b"} and modules["pkg"].imports == {"pkg.a"}


def test_walker_finds_private_imports(tmp_path):
    modules = plant(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "_hidden = 1\n__version__ = '1'\n",
            "b.py": "from .a import _hidden, __version__\nfrom os import _exit\n",
            "c.py": "def f():\n    from . import a as m\n    return m._hidden\n",
        },
    )
    assert modules["pkg.b"].private == ["line 1: from pkg.a import _hidden"]  # dunders and other packages pass
    assert modules["pkg.c"].private == ["line 3: pkg.a._hidden"]
    assert modules["pkg.a"].private == []


def test_model_code_asks_its_backend_and_tests_no_device():
    pattern = re.compile(r"mx\.cpu\b|default_device|cpu_math|cpu_kernels|on_cpu")
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sorted((ROOT / "entropix_mlx" / "model").rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line) and not line.lstrip().startswith("#")
    ]
    assert not found, "\n".join(found)


def test_the_library_keeps_no_state_in_module_level_lists_or_dicts():
    # A module-level name bound to an empty list or dict (or one kept in a
    # one-element list) is state some call fills in for the whole process.
    found = []
    for path in sorted((ROOT / "entropix_mlx").rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            empty = isinstance(value, (ast.List, ast.Dict)) and not (
                value.elts if isinstance(value, ast.List) else value.keys
            )
            boxed = isinstance(value, ast.List) and len(value.elts) == 1 and isinstance(value.elts[0], ast.Constant)
            if empty or boxed:
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(t)}" for t in targets]
    assert not found, "\n".join(found)


# One home each for encoding a prompt and fitting a request to the context: the front
# door's `encode_prompt` (`LoadedModel.encode`) and `fit` (`LoadedModel.prepare`).
ENCODERS = ("encode_chat", "encode_raw", "apply_chat_template")
ENCODING_HOMES = ("entropix_mlx/front/loaded.py", "entropix_mlx/decode/prompt.py")
# Who reads the context's length: the model's own settings, the front door that fits
# requests to it, and the decoder's machinery (the batch engine's guard, a row's cache size).
CONTEXT_READERS = (
    "entropix_mlx/model/",
    "entropix_mlx/front/loaded.py",
    "entropix_mlx/decode/engine.py",
    "entropix_mlx/decode/group.py",
)
PRODUCT_AND_LAB = ("entropix_mlx", "cli", "research")


def calls_to(tree: ast.AST, names: tuple[str, ...]) -> list[int]:
    """The lines where `tree` calls one of `names`, as a function or a method."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)) in names
    ]


def attribute_reads(tree: ast.AST, name: str) -> list[int]:
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == name]


def sources(folders=PRODUCT_AND_LAB):
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            yield path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8"))


def test_prompts_are_encoded_only_by_the_front_door():
    found = [
        f"{rel}:{line}" for rel, tree in sources() if rel not in ENCODING_HOMES for line in calls_to(tree, ENCODERS)
    ]
    assert not found, "encode prompts with front.encode_prompt (LoadedModel.encode):\n" + "\n".join(found)


def test_requests_are_fitted_to_the_context_only_by_the_front_door():
    found = [
        f"{rel}:{line}"
        for rel, tree in sources()
        if not rel.startswith(CONTEXT_READERS)
        for line in attribute_reads(tree, "max_position_embeddings")
    ]
    assert not found, "fit requests with front.fit (LoadedModel.prepare, LoadedModel.context):\n" + "\n".join(found)


def test_the_call_and_attribute_finders_catch_a_method_a_function_and_a_read():
    tree = ast.parse(
        "a = tok.apply_chat_template(m)\nb = encode_chat(t, m)\nc = encode_chats(t)\nd = m.args.max_position_embeddings\n"
    )
    assert calls_to(tree, ENCODERS) == [1, 2]
    assert attribute_reads(tree, "max_position_embeddings") == [4]


def test_a_model_meets_its_card_in_one_place():
    found = [
        f"{rel}:{line}"
        for rel, tree in sources()
        if rel != "entropix_mlx/front/loaded.py"
        for line in calls_to(tree, ("LoadedModel", "ModelCard"))
    ]
    assert not found, "bind a model to its card with LoadedModel.bind:\n" + "\n".join(found)


def test_chat_reaches_its_conversation_through_the_front_door(package):
    # LoadedModel.conversation: each turn is encoded and prepared by the loaded model, as `run`'s prompt is.
    found = [
        m.name
        for m in package.values()
        if ("entropix_mlx.decode.chat", "Conversation") in imported_names(m)
        and not m.name.startswith(("entropix_mlx.decode", "entropix_mlx.front"))
    ]
    assert not found, "these make a Conversation themselves; use LoadedModel.conversation:\n" + "\n".join(found)
    assert ("entropix_mlx.decode.generate", "generate") not in imported_names(package["entropix_mlx.decode.chat"])
