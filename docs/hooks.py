"""MkDocs hooks: example pages, README sections, repository files, API check.

- `examples/*.py` become pages, keras.io style: the module docstring and
  every top-level string statement are prose (Markdown), the code between
  them is shown as it runs.
- A line `--8<-- README.md:NAME` includes the README's section between
  `<!-- docs:start NAME -->` and `<!-- docs:end NAME -->`, so that the guide
  and the README share one text; the README's `docs/...` links are made
  relative to the page.
- A page's link to a repository file outside `docs/` (`../benchmarks/...`)
  copies that file into the site.
- The build fails (a warning, under `strict`) when a public name has no
  docstring or appears on no API page (`::: name`).
"""

import ast
import logging
import os
import posixpath
import re

import griffe
from mkdocs.structure.files import File

log = logging.getLogger("mkdocs.hooks.keras_svr_attention")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "keras_svr_attention"
INCLUDE = re.compile(r"^--8<-- README\.md:([\w-]+)\s*$", re.MULTILINE)
REPO_LINK = re.compile(r"\]\(\.\./((?:benchmarks|examples)/[^)#\s]+)")
IDENTIFIER = re.compile(r"^::: ([\w.]+)", re.MULTILINE)

_documented = set()


def _read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def example_markdown(source, path):
    """A script as a page: top-level strings are prose, the rest code."""
    tree = ast.parse(source)
    lines = source.splitlines()
    parts, start = [], 0
    for node in tree.body:
        is_text = (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        )
        if not is_text:
            continue
        code = "\n".join(lines[start : node.lineno - 1]).strip("\n")
        if code.strip():
            parts.append(f"```python\n{code}\n```")
        parts.append(ast.get_docstring(ast.Module([node], [])) or "")
        start = node.end_lineno
    code = "\n".join(lines[start:]).strip("\n")
    if code.strip():
        parts.append(f"```python\n{code}\n```")
    first, *rest = parts
    title, _, intro = first.partition("\n")
    header = f"# {title.rstrip('.')}\n\n`{path}`. {intro.strip()}"
    return "\n\n".join([header, *rest]) + "\n"


def readme_section(name):
    text = _read("README.md")
    match = re.search(
        rf"<!-- docs:start {name} -->\n(.*?)<!-- docs:end {name} -->",
        text,
        re.DOTALL,
    )
    if match is None:
        log.warning("README.md has no section %r for the docs", name)
        return ""
    return match.group(1)


def on_files(files, config):
    for name in sorted(os.listdir(os.path.join(ROOT, "examples"))):
        if name.endswith(".py") and not name.startswith("_"):
            path = f"examples/{name}"
            files.append(
                File.generated(
                    config,
                    f"examples/{name[:-3]}.md",
                    content=example_markdown(_read(path), path),
                )
            )
    # Repository files that pages link to with ../: copied into the site.
    linked = set()
    for page in files.documentation_pages():
        if not page.generated_by:
            linked.update(REPO_LINK.findall(page.content_string))
    for path in sorted(linked):
        if os.path.isfile(os.path.join(ROOT, path)):
            with open(os.path.join(ROOT, path), "rb") as f:
                files.append(File.generated(config, path, content=f.read()))
    return files


def on_page_markdown(markdown, page, config, files):
    def include(match):
        section = readme_section(match.group(1))
        depth = page.file.src_uri.count("/")
        return re.sub(
            r"\]\(docs/",
            "](" + "../" * depth,
            section,
        )

    markdown = INCLUDE.sub(include, markdown)
    src_dir = posixpath.dirname(page.file.src_uri)
    if not src_dir:
        markdown = REPO_LINK.sub(r"](\1", markdown)
    _documented.update(IDENTIFIER.findall(markdown))
    return markdown


def _public_api():
    """Every public name: the package's __all__ and the public modules'
    own functions, classes and constants."""
    package = griffe.load(PACKAGE, search_paths=[ROOT])
    names = {}
    for name in package.exports or ():
        names[f"{PACKAGE}.{name}"] = package[name]
    modules = [m for m in names.values() if m.is_module]
    while modules:
        module = modules.pop()
        for member in module.members.values():
            if member.name.startswith("_") or member.is_alias:
                continue
            if member.is_module:
                modules.append(member)
            names[member.path] = member
    return package, names


def _covered(obj, documented_paths):
    path = obj.canonical_path if obj.is_alias else obj.path
    parts = path.split(".")
    return any(
        ".".join(parts[:i]) in documented_paths
        for i in range(2, len(parts) + 1)
    )


def on_env(env, config, files):
    package, names = _public_api()
    documented = set()
    for identifier in _documented:
        try:
            obj = package.modules_collection[identifier]
        except KeyError:
            log.warning("`::: %s` names nothing in the package", identifier)
            continue
        documented.add(obj.canonical_path if obj.is_alias else obj.path)
    for name, obj in sorted(names.items()):
        target = obj.final_target if obj.is_alias else obj
        if not target.docstring:
            log.warning("public name %s has no docstring", name)
        if not _covered(obj, documented):
            log.warning("public name %s is on no API page (::: ...)", name)
    return env
