// Injected into a COPY of a card by tests/test_glance.py: measures, after layout, whether the
// page scrolls sideways and whether any element or text lies outside what the reader can see:
// the viewport, unless an ancestor scrolls it horizontally (overflow-x auto/scroll) and that
// ancestor itself fits; and never outside an ancestor that clips it (overflow hidden/clip,
// which includes every <svg>'s own viewport). Writes JSON into a <pre> it appends, and posts it
// to the parent page when it runs in a frame (headless Chromium's window is never narrower
// than 500 px, so the test loads the card in an iframe of the width it checks).
(function () {
  const vw = document.documentElement.clientWidth;
  const de = document.documentElement;
  const out = {
    innerWidth: window.innerWidth, clientWidth: vw, scrollWidth: de.scrollWidth,
    bodyScrollWidth: document.body.scrollWidth,
    htmlOverflowX: getComputedStyle(de).overflowX,
    bodyOverflowX: getComputedStyle(document.body).overflowX,
    checked: 0, cut: [],
  };
  const TOL = 1.0;
  function name(el) {
    let s = el.tagName.toLowerCase();
    if (el.id) s += "#" + el.id;
    if (el.classList && el.classList.length) s += "." + Array.from(el.classList).join(".");
    return s;
  }
  function path(el) {
    const parts = [];
    for (let a = el; a && a !== document.body && parts.length < 4; a = a.parentElement) {
      parts.unshift(name(a));
    }
    return parts.join(" > ");
  }
  // where an element must lie: inside every clipping ancestor, and inside the viewport unless
  // a horizontally scrolling ancestor (not html/body) holds it
  function problems(el, r, what) {
    const found = [];
    let scroller = null;
    for (let a = el.parentElement; a && a !== document.body && a !== de; a = a.parentElement) {
      const cs = getComputedStyle(a);
      const ox = cs.overflowX;
      const b = a.getBoundingClientRect();
      if (ox === "hidden" || ox === "clip" || cs.overflowY === "hidden" || cs.overflowY === "clip") {
        if (r.left < b.left - TOL || r.right > b.right + TOL ||
            r.top < b.top - TOL || r.bottom > b.bottom + TOL) {
          found.push({ what, where: path(el), clipped_by: path(a),
                       box: [r.left, r.top, r.right, r.bottom].map(Math.round),
                       clip: [b.left, b.top, b.right, b.bottom].map(Math.round),
                       text: (el.textContent || "").trim().slice(0, 60) });
          break;
        }
      }
      if (!scroller && (ox === "auto" || ox === "scroll")) scroller = a;
    }
    if (!scroller && (r.left < -TOL || r.right > vw + TOL)) {
      found.push({ what, where: path(el), outside_viewport: [Math.round(r.left), Math.round(r.right)],
                   text: (el.textContent || "").trim().slice(0, 60) });
    }
    return found;
  }
  for (const el of document.body.querySelectorAll("*")) {
    if (["SCRIPT", "STYLE", "TITLE", "DESC"].includes(el.tagName.toUpperCase())) continue;
    if (el.id === "layout-probe") continue;
    const r = el.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    out.checked += 1;
    out.cut.push(...problems(el, r, "element"));
  }
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let t = walker.nextNode(); t; t = walker.nextNode()) {
    const p = t.parentElement;
    if (!p || !t.textContent.trim()) continue;
    if (["SCRIPT", "STYLE", "TITLE", "DESC"].includes(p.tagName.toUpperCase())) continue;
    const range = document.createRange();
    range.selectNodeContents(t);
    const r = range.getBoundingClientRect();
    if (r.width === 0 && r.height === 0) continue;
    out.checked += 1;
    out.cut.push(...problems(p, r, "text").map((x) => Object.assign(x, { text: t.textContent.trim().slice(0, 60) })));
  }
  out.cut = out.cut.slice(0, 40);
  // each summary row: where its check's name and its verdict badge are (issue 30: on a phone
  // the rows stack, and a verdict must stay in view beside its name)
  out.summary = Array.from(document.querySelectorAll("table.summary tbody tr")).map((tr) => {
    const name = tr.querySelector("th.name, td:first-child").getBoundingClientRect();
    const v = tr.querySelector(".verdict").getBoundingClientRect();
    return { name: (tr.querySelector("th.name a") || tr.firstElementChild).textContent.trim(),
             n: [name.left, name.top, name.right, name.bottom].map(Math.round),
             v: [v.left, v.top, v.right, v.bottom].map(Math.round) };
  });
  const pre = document.createElement("pre");
  pre.id = "layout-probe";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
  if (window.parent !== window) window.parent.postMessage(pre.textContent, "*");
})();
