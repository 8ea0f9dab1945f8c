"""The built documentation site, opened in headless Chromium.

Run by `nox -s docs` after `mkdocs build` (`KSA_DOCS_SITE` names the built
site, `KSA_DOCS_SCREENSHOTS` a folder for the pages' screenshots). The pages
are served on localhost, as a reader's browser would load them, and checked
after their scripts ran: the title, the code blocks, the equations typeset
by KaTeX (no KaTeX error), the API entries rendered from the docstrings.
"""

import functools
import html.parser
import http.server
import os
import re
import shutil
import subprocess
import tempfile
import threading

import pytest

pytestmark = pytest.mark.docs

SITE = os.environ.get("KSA_DOCS_SITE", "site")
SCREENSHOTS = os.environ.get("KSA_DOCS_SCREENSHOTS")
# No network here: keep Chromium from calling home (each refused
# connection would otherwise be retried while the page loads).
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=15000",
]


class _Page(html.parser.HTMLParser):
    """Text by tag, each paragraph's text, the images' sources and the
    classes seen, from a rendered DOM."""

    def __init__(self):
        super().__init__()
        self.classes, self.text, self._open = [], {}, []
        self.paragraphs, self.images = [], []

    def handle_starttag(self, tag, attrs):
        self._open.append(tag)
        if tag == "p":
            self.paragraphs.append("")
        if tag == "img":
            self.images.append(dict(attrs).get("src", ""))
        for name, value in attrs:
            if name == "class" and value:
                self.classes.extend(value.split())

    def handle_endtag(self, tag):
        if tag in self._open:
            while self._open.pop() != tag:
                pass

    def handle_data(self, data):
        if {"annotation", "script", "style"} & set(self._open):
            return  # not shown: KaTeX's LaTeX source, code
        for tag in set(self._open):
            self.text.setdefault(tag, []).append(data)
        if "p" in self._open:
            self.paragraphs[-1] += data

    def joined(self, tag):
        return "".join(self.text.get(tag, []))


@pytest.fixture(scope="module")
def site_url():
    if not os.path.isfile(os.path.join(SITE, "index.html")):
        pytest.fail(f"no built site at {SITE!r}: run `nox -s docs`")
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=SITE
    )
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def _chromium(args, tries=3):
    """Runs headless Chromium; a run that hangs (seen under a loaded CI
    machine, where the same page otherwise renders in 2 s) is killed after
    90 s and started again in a fresh profile."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("Chromium is needed: apt-get install chromium")
    for attempt in range(tries):
        with tempfile.TemporaryDirectory() as profile:
            flags = [*CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
            try:
                return subprocess.run(
                    [chromium, *flags, *args],
                    capture_output=True,
                    text=True,
                    timeout=90,
                    check=True,
                ).stdout
            except subprocess.TimeoutExpired:
                if attempt == tries - 1:
                    raise


def render(url, name):
    """The page's DOM after its scripts ran; a screenshot when asked."""
    dom = _chromium(["--dump-dom", url])
    if SCREENSHOTS:
        os.makedirs(SCREENSHOTS, exist_ok=True)
        path = os.path.join(SCREENSHOTS, name)
        _chromium(["--window-size=1280,1400", f"--screenshot={path}.png", url])
    page = _Page()
    page.feed(dom)
    return page


def test_home_page_renders_title_code_and_equations(site_url):
    page = render(f"{site_url}/index.html", "home")
    assert "keras-svr-attention" in page.joined("h1")
    assert "ksa.AttentionBNSH(" in page.joined("code")
    # Every equation typeset: no raw \( \) left, no KaTeX error.
    assert page.classes.count("katex") >= 8, page.classes.count("katex")
    assert "katex-error" not in page.classes
    # No LaTeX left as text: KaTeX keeps its source in <annotation> only.
    visible = page.joined("p") + page.joined("li")
    assert not re.search(r"\\[a-zA-Z(\[]", visible), visible


def test_api_page_renders_every_layer_from_its_docstring(site_url):
    page = render(f"{site_url}/api/layers.html", "api_layers")
    assert "Layers" in page.joined("h1")
    headings = page.joined("h2")
    for name in ("SVRAttention", "SVRGroupedQueryAttention", "AttentionBNSH"):
        assert name in headings, name
    # The docstring's equation block and its doctest, as code.
    code = page.joined("code")
    assert "softmax_j((q_i - b mu_i)^T (k_j - b mu_i) / sqrt(D))" in code
    assert "layer = SVRAttention(num_heads=4" in code
    assert "doc-signature" in page.classes or "highlight" in page.classes


def test_guide_page_renders_its_own_text(site_url):
    page = render(f"{site_url}/guide/masks.html", "guide_masks")
    assert "Masks and causality" in page.joined("h1")
    assert "Causal means causal." in page.joined("strong")


def _pages():
    """Every HTML page of the built site (relative paths), 404 left out."""
    pages = []
    for folder, _, files in os.walk(SITE):
        for name in files:
            path = os.path.relpath(os.path.join(folder, name), SITE)
            if name.endswith(".html") and path != "404.html":
                pages.append(path)
    return sorted(pages)


def test_every_page_renders_its_lists_images_and_equations(site_url):
    """Each page of the site in Chromium: no list left as a paragraph of
    dashes (Python-Markdown needs a blank line before a list, GitHub's
    renderer does not), no image whose file the site lacks, no equation
    KaTeX could not typeset."""
    pages = _pages()
    assert len(pages) >= 15, pages
    for path in pages:
        page = render(f"{site_url}/{path}", path.replace("/", "_"))
        for text in page.paragraphs:
            assert not re.search(r"(^|\n)\s*[-*] \S", text), (path, text)
        assert "katex-error" not in page.classes, path
        for src in page.images:
            if src.startswith(("data:", "http")):
                continue
            local = os.path.normpath(
                os.path.join(SITE, os.path.dirname(path), src.split("#")[0])
            )
            assert os.path.isfile(local), (path, src)
