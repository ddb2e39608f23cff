// The language switch leads to the same place in the other edition: the section the
// reader is at (the #anchor: a labelled section has the same one in both editions) and,
// on the search page, the query (?q=...). The built link names the page alone.
(() => {
  const follow = () => {
    document.querySelectorAll("a.language-switch__link").forEach((link) => {
      const url = new URL(link.getAttribute("href"), window.location.href);
      url.search = window.location.search;
      url.hash = window.location.hash;
      link.href = url.href;
    });
  };
  document.addEventListener("DOMContentLoaded", follow);
  window.addEventListener("hashchange", follow);
})();
