// relpos_ref docs: nothing on a page is cut off.
//
// A display equation wider than the column is scaled down until it fits (to
// 70% at the least) instead of hiding its end behind a scroll bar, and marked
// with data-relpos-fit. The pages break their own long equations to fit the
// column (tests/test_docs_site.py); this catches the docstrings' equations and
// windows narrower than the layouts the tests measure.
(() => {
  const SMALLEST = 0.7;

  function fit() {
    for (const box of document.querySelectorAll("div.math mjx-container")) {
      const math = box.querySelector("mjx-math");
      if (!math) continue;
      math.style.fontSize = "";
      delete box.dataset.relposFit;
      let scale = 1;
      for (let pass = 0; pass < 3 && box.scrollWidth > box.clientWidth + 1; pass++) {
        scale = Math.max(SMALLEST, (scale * box.clientWidth) / box.scrollWidth);
        math.style.fontSize = `${(scale * 100).toFixed(1)}%`;
        box.dataset.relposFit = scale.toFixed(3);
      }
    }
  }

  function whenTypeset(tries) {
    const startup = window.MathJax && window.MathJax.startup;
    if (startup && startup.promise) {
      startup.promise.then(fit);
    } else if (tries > 0) {
      setTimeout(() => whenTypeset(tries - 1), 100);
    }
  }

  document.addEventListener("DOMContentLoaded", () => {
    if (document.querySelector("div.math")) whenTypeset(100);
  });
  window.addEventListener("resize", fit);
})();
