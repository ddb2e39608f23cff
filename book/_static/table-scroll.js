// A table, printed output or code cell wider than its column scrolls sideways inside
// its own box (the page itself never does). On a phone that box says so: a line above
// it ("scrolls sideways"), a fade on the edge that has more, and it takes the keyboard's
// focus so that the arrow keys scroll it, with a name a screen reader reads. A box that
// fits is left as it is, so wide windows see no change.
(() => {
  // The words it writes, in the page's language (the English or the Chinese edition).
  const WORDS = document.documentElement.lang.startsWith("zh") ? {
    table: "表格", output: "输出", code: "代码",
    ofCell: (n) => `（第 ${n} 个代码单元）`,
    scrolls: (what) => `${what}（可左右滚动）`,
    hint: "↔ 比屏幕宽：左右滑动查看其余部分",
  } : {
    table: "table", output: "output", code: "code",
    ofCell: (n) => ` of cell ${n}`,
    scrolls: (what) => `${what} (scrolls sideways)`,
    hint: "↔ wider than the screen: scroll sideways for the rest",
  };

  const SELECTOR = [
    ".pst-scrollable-table-container",
    "div.cell_output pre",
    "div.cell_input div.highlight pre",
    "div.highlight pre",
  ].join(", ");

  // The name of a box: a table by its header cells, a code or output box by its kind.
  function nameOf(box) {
    const table = box.querySelector("table");
    if (table) {
      const caption = table.querySelector("caption");
      const heads = Array.from(table.querySelectorAll("thead th")).map((th) =>
        th.textContent.trim()).filter(Boolean);
      const what = caption ? caption.textContent.trim()
        : heads.length ? `${WORDS.table}: ${heads.join(", ")}` : WORDS.table;
      return WORDS.scrolls(what);
    }
    const cell = box.closest(".cell");
    const kind = box.closest(".cell_output") ? WORDS.output : WORDS.code;
    const cells = Array.from(document.querySelectorAll(".cell"));
    const number = cell ? WORDS.ofCell(cells.indexOf(cell) + 1) : "";
    return WORDS.scrolls(`${kind}${number}`);
  }

  function update(box, used = new Set()) {
    const wide = box.scrollWidth > box.clientWidth + 1;
    const left = wide && box.scrollLeft > 1;
    const right = wide && box.scrollLeft + box.clientWidth < box.scrollWidth - 1;
    box.classList.toggle("scrolls", wide);
    box.classList.toggle("more-left", left);
    box.classList.toggle("more-right", right);
    let hint = box.previousElementSibling;
    if (!(hint && hint.classList.contains("scroll-hint"))) hint = null;
    if (wide) {
      box.tabIndex = 0;
      box.setAttribute("role", "region");
      // Each name once on a page (two outputs of one cell get "2", "3", ...).
      let name = nameOf(box);
      for (let n = 2; used.has(name); n += 1) name = `${nameOf(box)} ${n}`;
      used.add(name);
      box.setAttribute("aria-label", name);
      if (!hint && box.matches(".pst-scrollable-table-container, .cell_output pre")) {
        hint = document.createElement("p");
        hint.className = "scroll-hint";
        hint.setAttribute("aria-hidden", "true"); // the box's name says it already
        hint.textContent = WORDS.hint;
        box.before(hint);
      }
    } else {
      box.removeAttribute("tabindex");
      box.removeAttribute("role");
      box.removeAttribute("aria-label");
      if (hint) hint.remove();
    }
  }

  function updateAll() {
    const used = new Set();
    document.querySelectorAll(SELECTOR).forEach((box) => update(box, used));
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll(SELECTOR).forEach((box) => {
      box.addEventListener("scroll", updateAll, { passive: true });
    });
    updateAll();
    // Layout changes: a rotated phone, a resized window, a cell opened or closed.
    let pending = 0;
    const later = () => {
      cancelAnimationFrame(pending);
      pending = requestAnimationFrame(updateAll);
    };
    window.addEventListener("resize", later);
    new ResizeObserver(later).observe(document.body);
    document.addEventListener("toggle", later, true);
  });
})();
