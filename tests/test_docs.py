"""The documentation site: it builds with warnings as errors, its generated references are
complete (every check kind with every parameter, every command), the commands it shows run or
at least parse, and a browser renders its start page and suite reference.

One build per session (``site``), with ``sphinx-build -W --keep-going -b html`` as
``scripts/docs.sh`` runs it; the pages are read as built, so what a reader sees is checked.
"""

from __future__ import annotations

import html
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import click
import numpy as np
import pytest
import yaml
from PIL import Image

import builders

pytestmark = pytest.mark.e2e
#: The tests that read the built site share one build of about 10-20 s: the slow tier.
built = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: Commands of the getting-started page that run here in a second or two, with no model.
CHEAP = {"--version", "--help", "suites", "schema", "keygen", "contact-sheet"}


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once: ``sphinx-build -W --keep-going -b html docs BUILD``."""
    out = tmp_path_factory.mktemp("docs") / "html"
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q",
                           "-b", "html", str(DOCS), str(out)],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return out


class _Tables(HTMLParser):
    """Every table of a page (or part of one) as rows of cell texts; ``None`` rows between
    tables are not kept."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self.tables:
            self.tables[-1][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def tables(fragment: str) -> list[list[list[str]]]:
    """The tables of an HTML fragment, each a list of rows of cell texts (header row first)."""
    parser = _Tables()
    parser.feed(fragment)
    return parser.tables


def section(page: str, anchor: str) -> str:
    """The HTML of the section whose id is ``anchor``, up to the next section at any level."""
    start = page.index(f'<section id="{anchor}"')
    end = page.find("<section id=", start + 1)
    return page[start:end if end > 0 else len(page)]


def text(fragment: str) -> str:
    """The visible text of an HTML fragment, on one line."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


# --- (a) the build and (b) the suite reference -------------------------------------------

@built
def test_every_check_kind_lists_every_constructor_parameter(site):
    """Generated from the declarations: each kind's parameters, in constructor order, with the
    constructor's annotation and default, the declared range and a meaning."""
    import inspect

    from certify.checks import CHECKS

    page = (site / "reference" / "suite.html").read_text(encoding="utf-8")
    for kind, cls in CHECKS.items():
        part = section(page, f"kind-{kind}".replace("_", "-"))
        params = [p for n, p in inspect.signature(cls.__init__).parameters.items()
                  if n != "self"]
        (listed, *_) = tables(part)
        header, *rows = listed
        assert header == ["parameter", "type", "default", "range", "meaning"], kind
        assert [r[0] for r in rows] == [p.name for p in params], kind
        for row, p in zip(rows, params, strict=True):
            assert row[1] == str(p.annotation), (kind, p.name)
            want = "required" if p.default is inspect.Parameter.empty else None
            if want:
                assert row[2] == want, (kind, p.name)
            else:
                assert row[2] in (repr(p.default), json.dumps(p.default)), (kind, p.name)
            assert row[3] == cls.suite_params[p.name].allowed(), (kind, p.name)
            assert len(row[4]) > 10, (kind, p.name, "no meaning")
        # its metrics, and the thresholdable ones marked
        metrics = next(t for t in tables(part) if t[0][:2] == ["metric", "meaning"])
        assert [r[0] for r in metrics[1:]] == [m.name for m in cls.metrics], kind
        assert {r[0] for r in metrics[1:] if r[4] == "threshold"} == set(cls.metric_names)


@built
def test_the_suite_reference_lists_every_kind_status_property_and_attack(site):
    from certify.attacks import ATTACKS
    from certify.checks import CHECKS
    from certify.errors import STATUS_MEANINGS
    from certify.perturbations import PROPERTIES
    from certify.results import Status

    page = (site / "reference" / "suite.html").read_text(encoding="utf-8")
    kinds = tables(section(page, "suite-kinds"))[0]
    assert [r[0] for r in kinds[1:]] == list(CHECKS)
    statuses = tables(section(page, "suite-statuses"))[0]
    assert [r[0] for r in statuses[1:]] == list(STATUS_MEANINGS)
    assert set(STATUS_MEANINGS) == set(Status.__args__)
    for kind, cls in CHECKS.items():
        assert set(cls.statuses) <= set(STATUS_MEANINGS), kind
    props = tables(section(page, "suite-properties"))[0]
    assert [r[0] for r in props[1:]] == list(PROPERTIES)
    attacks = tables(section(page, "suite-attacks"))[0]
    assert [r[0] for r in attacks[1:]] == list(ATTACKS)
    for name, attack in ATTACKS.items():  # each attack's attack_params, as declared
        part = section(page, f"attack-{name}".replace("_", "-"))
        listed = tables(part)
        declared = list(attack.suite_params)
        assert [r[0] for r in (listed[0][1:] if listed else [])] == \
            [p.name for p in declared], name


def test_every_check_describes_its_parameters_and_nothing_else():
    """The declaration the reference is generated from: one meaning per constructor parameter
    (its type and default held to the signature: tests/test_params.py)."""
    import inspect

    from certify.checks import CHECKS

    for kind, cls in CHECKS.items():
        names = [n for n in inspect.signature(cls.__init__).parameters if n != "self"]
        assert cls.suite_params.names() == names, kind
        assert [p.name for p in cls.parameters()] == names
        assert all(len(p.meaning) > 10 for p in cls.parameters()), kind


@built
def test_the_suite_page_example_and_keys_are_a_valid_suite(site):
    from certify import suite

    source = (DOCS / "reference" / "suite.md").read_text(encoding="utf-8")
    (example,) = re.findall(r"```yaml\n(.*?)```", source, flags=re.S)
    parsed = suite.parse_suite(yaml.safe_load(example), "docs/reference/suite.md")
    assert parsed.checks
    page = (site / "reference" / "suite.html").read_text(encoding="utf-8")
    part = page[page.index('id="suite-file"'):page.index('id="suite-kinds"')]
    keys = [r[0] for t in tables(part) for r in t[1:]]
    for params in suite.SECTIONS.values():
        assert set(params.names()) <= set(keys)


# --- (c) the CLI, results, exit-code and HTTP references ----------------------------------

def _commands(group: click.Group, path: tuple[str, ...] = ()):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        yield (*path, name), cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, (*path, name))


@built
def test_the_cli_reference_lists_every_command_and_option(site):
    from certify.cli import main

    page = (site / "reference" / "cli.html").read_text(encoding="utf-8")
    found = 0
    for path, cmd in _commands(main):
        anchor = "-".join(("certify", *path))
        assert f'id="{anchor}"' in page, f"certify {' '.join(path)} is not in the reference"
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.hidden:
                ids = {f'id="cmdoption-{anchor}-{o.lstrip("-")}"' for o in param.opts}
                assert any(i in page for i in ids), (path, param.opts)
        found += 1
    assert found >= 20


@built
def test_the_results_reference_is_certify_schema(site):
    from certify.results import json_schema

    proc = builders.run_cli("schema")
    assert proc.returncode == 0
    (download,) = (site / "_downloads").rglob("certify-results.schema.json")
    assert json.loads(download.read_text()) == json.loads(proc.stdout) == json_schema()
    page = (site / "reference" / "results.html").read_text(encoding="utf-8")
    for name in json_schema()["$defs"]:
        assert f'id="results-{name.lower()}"' in page, name


@built
def test_the_exit_codes_and_http_references_are_complete(site):
    from certify.errors import EXIT_CODES

    page = (site / "reference" / "exit-codes.html").read_text(encoding="utf-8")
    codes = tables(page)[0]
    assert [int(r[0]) for r in codes[1:]] == list(EXIT_CODES)
    doc = json.loads((DOCS / "_generated" / "openapi.json").read_text())
    page = (site / "reference" / "http.html").read_text(encoding="utf-8")
    for path, operations in doc["paths"].items():
        for method in operations:
            assert f"{method.upper()} {path}" in text(page), (method, path)
    assert "model_name" in text(section(page, "http-api"))  # a form body, field by field


def test_the_github_action_page_lists_the_actions_inputs_and_outputs():
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    page = (DOCS / "github-actions.md").read_text()
    documented = set()
    for row in re.findall(r"^\| `([^|]+)` \|", page, flags=re.M):
        documented |= set(re.findall(r"[\w-]+", row))
    assert set(action["inputs"]) <= documented
    assert set(action["outputs"]) <= documented


# --- (d) the commands the pages show ------------------------------------------------------

def _doc_commands(source: str) -> list[list[str]]:
    """Every ``certify ...`` command line in a page's shell blocks, as argv without the
    program, with comments, optional ``[...]`` parts and a ``> FILE`` redirect taken off
    (the file name kept apart as a last element ``>FILE``)."""
    out = []
    for block in re.findall(r"```(?:bash|sh|console)\n(.*?)```", source, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s#.*$", "", line).strip()
            match = re.search(r"(?:^|\s|&&\s*)(?:\S*/)?certify\s+(.*)$", line)
            if not match or line.startswith("#") or line.startswith("docker build"):
                continue
            argv = shlex.split(re.sub(r"\[[^\]]*\]", "", match.group(1)))
            if ">" in argv:
                at = argv.index(">")
                argv = [*argv[:at], f">{argv[at + 1]}"]
            out.append(argv)
    return out


def _leaf(argv: list[str]) -> click.Context | None:
    """Parse a command line as certify would (``None`` for the group's own options)."""
    from certify.cli import main

    cmd: click.Command = main
    path: list[str] = []
    rest = list(argv)
    while isinstance(cmd, click.Group):
        if not rest or rest[0].startswith("-"):
            return None
        sub = cmd.get_command(click.Context(cmd), rest[0])
        if sub is None:
            raise click.UsageError(f"no command {rest[0]!r} under certify {' '.join(path)}")
        path.append(rest.pop(0))
        cmd = sub
    return cmd.make_context(" ".join(["certify", *path]), rest)


def test_the_getting_started_commands_run(tmp_path, monkeypatch):
    """The cheap commands of the getting-started page, in-process, as a reader types them."""
    from certify.results import json_schema
    from certify.version import __version__

    monkeypatch.chdir(tmp_path)
    ran = []
    for argv in _doc_commands((DOCS / "getting-started.md").read_text(encoding="utf-8")):
        if argv[0] not in CHEAP:
            continue
        redirect = argv.pop()[1:] if argv[-1].startswith(">") else None
        proc = builders.run_cli(*argv)
        assert proc.returncode == 0, (argv, proc.stderr)
        if redirect:
            Path(redirect).write_text(proc.stdout)
        ran.append(argv[0])
    assert {"--version", "suites", "schema", "keygen", "contact-sheet"} <= set(ran)
    assert json.loads(Path("certify-results.schema.json").read_text()) == json_schema()
    assert yaml.safe_load(Path("my-suite.yaml").read_text())["name"] == "gtsrb"
    assert (tmp_path / "keys" / "certify.pub").is_file() and Path("signs.png").is_file()
    assert __version__ in builders.run_cli("--version").stdout


def test_every_command_in_the_docs_names_real_commands_and_options():
    """Every ``certify`` line of every page parses: its commands exist, its options are the
    command's, nothing required is missing (a value may fail only as a file that is not here)."""
    checked = 0
    for page in sorted(DOCS.rglob("*.md")):
        if "_generated" in page.parts:
            continue
        for argv in _doc_commands(page.read_text(encoding="utf-8")):
            argv = [a for a in argv if not a.startswith(">")]
            try:
                _leaf(argv)
            except click.BadParameter as exc:  # e.g. --config FILE: read when parsed
                assert "No such file" in exc.format_message(), (page.name, argv, exc)
            except click.ClickException as exc:
                pytest.fail(f"{page.name}: certify {' '.join(argv)}: {exc.format_message()}")
            checked += 1
    assert checked >= 40


# --- (e) what a browser shows -------------------------------------------------------------

def _chromium(url: str, *flags: str) -> subprocess.CompletedProcess[str]:
    profile = tempfile.mkdtemp()
    try:
        return subprocess.run(
            [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-first-run", f"--user-data-dir={profile}", "--hide-scrollbars",
             "--window-size=1280,1600", *flags, url],
            capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


@built
@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is installed by setup.sh")
@pytest.mark.parametrize("page, headings", [
    ("index.html", ["certify", "Where to start"]),
    ("reference/suite.html", ["Suite reference", "The suite file", "Check kinds", "Statuses",
                              "Corruption properties", "Attacks"]),
])
@built
def test_a_browser_renders_the_start_page_and_the_suite_reference(site, tmp_path, page,
                                                                  headings):
    from certify.checks import CHECKS

    url = (site / page).as_uri()
    shot = tmp_path / "page.png"
    _chromium(url, f"--screenshot={shot}")
    with Image.open(shot) as im:
        assert im.size == (1280, 1600)
        gray = np.asarray(im.convert("L"), dtype=np.float64)
    assert gray.std() > 10, "the screenshot is blank"
    assert (gray < 128).mean() > 0.01, "no text drawn"
    dom = _chromium(url, "--dump-dom").stdout
    shown = {text(h).rstrip("#¶ ")
             for h in re.findall(r"<h[1-3][^>]*>(.*?)</h[1-3]>", dom, flags=re.S)}
    assert set(headings) <= shown, shown
    if page == "reference/suite.html":
        assert {f"{kind}" for kind in CHECKS} <= shown
    assert "furo" in dom  # the theme's markup and script, not a bare page


def _examples(page: str) -> list[str]:
    """Every ``certify …`` command line in the literal blocks of a built page, continuation
    lines joined, text as a reader copies it (HTML unescaped)."""
    found = []
    blocks = [html.unescape(re.sub(r"<[^>]+>", "", b)).splitlines()
              for b in re.findall(r"<pre>(.*?)</pre>", page, flags=re.S)]
    # click's \b paragraphs (the commands' examples) become line blocks, a div per line
    blocks += [[html.unescape(re.sub(r"<[^>]+>", "", ln)) for ln in
                re.findall(r'<div class="line">(.*?)</div>', b, flags=re.S)]
               for b in re.findall(r'<div class="line-block">(.*?)</div>\s*</div>', page,
                                   flags=re.S)]
    for lines in blocks:
        joined: list[str] = []
        for ln in lines:
            if joined and joined[-1].endswith("\\"):
                joined[-1] = joined[-1][:-1] + " " + ln.strip()
            else:
                joined.append(ln.strip())
        for ln in joined:
            ln = ln.split("  #", 1)[0].strip()
            m = re.search(r"(?:^|\$\(|\s)(certify\s.*?)(?:\)\s*$|$)", ln)
            if m and "[OPTIONS]" not in m.group(1):  # a usage synopsis is not an example
                # each command of a compound line (a && b, a | b, a; b) on its own
                found += [part for part in re.split(r"\s+(?:&&|\|\||\||;)\s+|;\s+",
                                                    m.group(1))
                          if part.startswith("certify ")]
    return found


def _parse_with_click(argv: list[str]) -> None:
    """Parse ``argv`` (after ``certify``) as click would, without running anything: each
    group's options, then the command's; raises click.UsageError for an unknown option, an
    option without its value, a missing required option or argument, or an unknown command."""
    from certify.cli import main

    cmd: click.Command = main
    args = list(argv)
    while True:
        ctx = click.Context(cmd, info_name=cmd.name)
        opts, rest, _ = cmd.make_parser(ctx).parse_args(args)
        if isinstance(cmd, click.Group):
            if not rest:
                return
            sub = cmd.get_command(ctx, rest[0])
            if sub is None:
                raise click.UsageError(f"no command {rest[0]!r}")
            cmd, args = sub, rest[1:]
            continue
        for p in cmd.params:
            if p.required and p.name not in opts:
                raise click.UsageError(f"missing {p.name!r}")
        return


@built
def test_every_example_of_the_cli_reference_parses_with_click(site):
    """Issue 62: what a reader pastes from the CLI reference runs: no smart quote turns
    ``--suite`` into ``–suite`` or a quote into a curly one, and every example names real
    commands and options with their values."""
    page = (site / "reference" / "cli.html").read_text(encoding="utf-8")
    examples = _examples(page)
    assert len(examples) >= 20, examples
    for line in examples:
        assert not set(line) & set("–—‘’“”"), line
        words = [w for w in shlex.split(line) if not re.fullmatch(r"[A-Z_]+=\S*", w)]
        assert words[0] == "certify", line
        try:
            _parse_with_click(words[1:])
        except click.UsageError as exc:
            raise AssertionError(f"{line}: {exc}") from None
