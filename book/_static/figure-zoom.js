// Every figure of a chapter opens at full size in a new tab when clicked: on a phone a
// wide figure is scaled down to the column, and its labels are read by zooming in.
// The link's title is in the page's language (the English or the Chinese edition).
document.addEventListener("DOMContentLoaded", () => {
  const chinese = document.documentElement.lang.startsWith("zh");
  const title = chinese ? "在新标签页中打开原尺寸的图" : "Open the figure at full size";
  document.querySelectorAll("div.cell_output img").forEach((img) => {
    if (img.closest("a")) return;
    const link = document.createElement("a");
    link.href = img.getAttribute("src");
    link.target = "_blank";
    link.rel = "noopener";
    link.className = "figure-zoom";
    link.title = title;
    img.replaceWith(link);
    link.appendChild(img);
  });
});
