// Typeset the pages' equations (pymdownx.arithmatex, generic mode) with the
// KaTeX that `nox -s docs` copies into assets/katex: no CDN, works offline.
function renderMath() {
  renderMathInElement(document.body, {
    delimiters: [
      { left: "\\[", right: "\\]", display: true },
      { left: "\\(", right: "\\)", display: false },
    ],
    throwOnError: false,
  });
}
if (typeof document$ !== "undefined") {
  document$.subscribe(renderMath); // Material's instant navigation
} else {
  document.addEventListener("DOMContentLoaded", renderMath);
}
