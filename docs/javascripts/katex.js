// KaTeX (vendored under docs/vendor/katex/, no network) for pymdownx.arithmatex's generic mode,
// as the Material for MkDocs documentation sets it up; re-run on every page (instant loading).
document$.subscribe(({ body }) => {
  renderMathInElement(body, {
    delimiters: [
      { left: "\\(", right: "\\)", display: false },
      { left: "\\[", right: "\\]", display: true }
    ],
    throwOnError: false
  });
});
