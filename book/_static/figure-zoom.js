// Every figure of a chapter opens at full size in a new tab when clicked: on a phone a
// wide figure is scaled down to the column, and its labels are read by zooming in.
document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("div.cell_output img").forEach((img) => {
    if (img.closest("a")) return;
    const link = document.createElement("a");
    link.href = img.getAttribute("src");
    link.target = "_blank";
    link.rel = "noopener";
    link.className = "figure-zoom";
    link.title = "Open the figure at full size";
    img.replaceWith(link);
    link.appendChild(img);
  });
});
