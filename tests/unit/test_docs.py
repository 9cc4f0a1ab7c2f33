"""The README is a map and the pages it leads to are there: README.md stays short, every
relative link in it and in docs/ names a file of the repository, its layer list is the
import-linter contracts, and no file cites a design or style document outside the repository."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from tests.support import checkout

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 260
"""A map a newcomer reads first; what does not fit goes to a page of docs/."""
SCANNED = (
    "libs", "services", "tests", "deploy", "proto", "docs", ".ci",
    "Makefile", "pyproject.toml", "Dockerfile", "README.md", "DEVELOPERS.md", "BENCHMARKS.md",
)  # fmt: skip
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CITATION = re.compile(r"(?<![\w/.-])(?:DESIGN\.md|STYLE\.md|reference/[\w.-]+\.md)")
"""A citation of a document by name: the team's design and style notes, a reference page."""


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def anchors(markdown: str) -> set[str]:
    """The anchors of `markdown`'s headings, as GitHub makes them."""
    headings = re.findall(r"^#+ (.+)$", markdown, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def missing_links(page: Path, text: str) -> list[str]:
    """The relative links of `text` (the Markdown of `page`) that name no file or folder, or
    a heading their page lacks."""
    missing = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z+.-]*:", target):
            continue  # a URL
        path, _, anchor = target.partition("#")
        linked = page.parent / path if path else page
        found = linked.exists() and not (
            anchor
            and linked.suffix == ".md"
            and anchor not in anchors(linked.read_text() if path else text)
        )
        if not found:
            missing.append(f"{page.relative_to(ROOT)}: {target}")
    return missing


def citations_outside(text: str, present: set[str]) -> list[str]:
    """The documents `text` cites by name that no file of the repository is (`present`: every
    file's path relative to the root)."""
    return [
        cited
        for cited in CITATION.findall(text)
        if not any(path == cited or path.endswith("/" + cited) for path in present)
    ]


def readme_layers(text: str, container: str) -> list[set[str]]:
    """The layers of `container` in the README's package list, top first."""
    block = text.split("Packages, each importing only those below it", 1)[1]
    block = block.split("```", 2)[1]
    layers = []
    for line in block.splitlines():
        names = re.split(r"\s{2,}", line.strip())[0]
        modules = {name.strip() for name in names.split("|") if name.strip()}
        if modules and all(module.startswith(container + ".") for module in modules):
            layers.append({module.removeprefix(container + ".") for module in modules})
    return layers


def contract_layers(pyproject: str, container: str) -> list[set[str]]:
    """The layers of `container` in the import-linter layers contract, top first."""
    contracts = tomllib.loads(pyproject)["tool"]["importlinter"]["contracts"]
    (contract,) = [c for c in contracts if c["type"] == "layers" and c["containers"] == [container]]
    return [{name.strip() for name in layer.split("|")} for layer in contract["layers"]]


def test_the_readme_is_a_map_of_at_most_260_lines() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move a subject to docs/"


def test_every_relative_link_of_the_readme_and_docs_names_a_file() -> None:
    assert (ROOT / "docs").is_dir()
    missing = [link for page in _pages() for link in missing_links(page, page.read_text())]
    assert missing == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    assert [p.name for p in _pages()[1:] if f"(docs/{p.name})" not in readme] == []


def test_the_readme_layers_are_the_import_linter_contracts() -> None:
    readme = (ROOT / "README.md").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    for container in ("gpuop", "gpuop_sim"):
        assert readme_layers(readme, container) == contract_layers(pyproject, container)


def test_no_file_cites_a_document_that_is_not_in_the_repository() -> None:
    files = checkout.files(SCANNED)
    present = {str(path.relative_to(ROOT)) for path in files}
    offending = [
        f"{path.relative_to(ROOT)}:{number}: {cited}"
        for path in files
        if path.suffix not in {".pyc", ".whl", ".gz", ".so"} and path != Path(__file__).resolve()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        for cited in citations_outside(line, present)
    ]
    assert offending == []


def test_the_checks_see_what_they_refuse() -> None:
    present = {"docs/events.md", "proto/events/asyncapi.yaml"}
    design, style = "DESIGN" + ".md", "STYLE" + ".md"  # apart, so this file passes its own scan
    assert citations_outside(f"The flow ({design} section 4), ({style})", present) == [
        design,
        style,
    ]
    assert citations_outside("(reference" + "/gpu-metrics.md §1)", present) == [
        "reference" + "/gpu-metrics.md"
    ]
    assert citations_outside("see docs/events.md and the README.md beside it", present) == []

    page = ROOT / "README.md"
    text = "[a](docs/gone.md) [b](tests/) [c](#x) [d](https://x.org/a.md) [e](DEVELOPERS.md#y)"
    assert missing_links(page, text) == [
        "README.md: docs/gone.md",
        "README.md: #x",
        "README.md: DEVELOPERS.md#y",
    ]
    text = "## A node's `first` look: here\n[a](#a-nodes-first-look-here) [b](DEVELOPERS.md)"
    assert missing_links(page, text) == []

    listed = "Packages, each importing only those below it:\n```\ngpuop.cli\ngpuop.a | gpuop.b  x\n"
    assert readme_layers(listed + "gpuop_sim.cli\n```", "gpuop") == [{"cli"}, {"a", "b"}]
    assert readme_layers(listed + "```", "gpuop_sim") == []
