// A table, printed output or code cell wider than its column scrolls sideways inside
// its own box (the page itself never does). On a phone that box says so: a line above
// it ("scrolls sideways"), a fade on the edge that has more, and it takes the keyboard's
// focus so that the arrow keys scroll it, with a name a screen reader reads. A box that
// fits is left as it is, so wide windows see no change.
(() => {
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
        : heads.length ? `table: ${heads.join(", ")}` : "table";
      return `${what} (scrolls sideways)`;
    }
    const cell = box.closest(".cell");
    const kind = box.closest(".cell_output") ? "output" : "code";
    const cells = Array.from(document.querySelectorAll(".cell"));
    const number = cell ? ` of cell ${cells.indexOf(cell) + 1}` : "";
    return `${kind}${number} (scrolls sideways)`;
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
        hint.textContent = "↔ wider than the screen: scroll sideways for the rest";
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
