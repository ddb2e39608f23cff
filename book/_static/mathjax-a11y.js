// MathJax's accessibility explorer (right-click a formula, Accessibility > Activate) reads
// formulas aloud and lets a reader walk them with the arrow keys. MathJax 3.2.2 cannot
// switch it on in a page it has already typeset (mathjax/MathJax#3124: every formula
// disappears), while a page loaded with the setting on works. So when a reader switches
// it on or off, MathJax saves the setting (as it always does) and the page reloads once.
// Runs before MathJax (which is deferred), adding to the configuration Sphinx wrote.
(function () {
  const config = (window.MathJax = window.MathJax || {});
  const startup = (config.startup = config.startup || {});
  startup.ready = function () {
    MathJax.startup.defaultReady();
    MathJax.startup.promise.then(function () {
      const menu = MathJax.startup.document.menu;
      const explorer = menu && menu.menu.pool.lookup("explorer");
      if (!explorer) return;
      const setValue = explorer.setValue.bind(explorer);
      explorer.setValue = function (value) {
        const changed = value !== explorer.getValue();
        setValue(value);
        if (changed) {
          menu.saveUserSettings();
          window.location.reload();
        }
      };
    });
  };
})();
