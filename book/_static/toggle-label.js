// The name a screen reader reads for each solution's toggle, in the page's language:
// sphinx-togglebutton writes "Toggle hidden content" in every edition. Its buttons are
// made when the page has loaded; this runs right after them.
document.addEventListener("DOMContentLoaded", () => setTimeout(() => {
  if (!document.documentElement.lang.startsWith("zh")) return;
  document.querySelectorAll("button.toggle-button").forEach((button) => {
    button.setAttribute("aria-label", "显示或隐藏内容");
  });
}, 0));
