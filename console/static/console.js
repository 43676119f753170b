// The console's only script besides htmx: the phone's menu, copy buttons, confirmations and
// upload progress.
// Loaded from the service itself; the pages carry no inline script (their CSP forbids it).
"use strict";

function announce(text) {
  const live = document.getElementById("live");
  if (live) {
    live.textContent = "";
    window.setTimeout(() => { live.textContent = text; }, 50);
  }
}

async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    await navigator.clipboard.writeText(text);
    return;
  }
  const area = document.createElement("textarea");
  area.value = text;
  area.setAttribute("readonly", "");
  area.className = "offscreen";
  document.body.appendChild(area);
  area.select();
  document.execCommand("copy");
  area.remove();
}

document.addEventListener("click", async (event) => {
  const button = event.target.closest("button[data-copy]");
  if (!button) {
    return;
  }
  const source = document.getElementById(button.dataset.copy);
  if (!source) {
    return;
  }
  try {
    await copyText(source.value !== undefined ? source.value : source.textContent.trim());
    button.dataset.copied = "yes";
    announce("Copied to the clipboard");
  } catch (error) {
    announce("Copying failed: select the text and copy it by hand");
  }
});

// At a phone's width the navigation is folded (console.css); the Menu button unfolds it.
document.addEventListener("click", (event) => {
  const menu = event.target.closest("button.menu-button");
  if (!menu) {
    return;
  }
  const open = menu.getAttribute("aria-expanded") !== "true";
  menu.setAttribute("aria-expanded", String(open));
  document.body.classList.toggle("menu-open", open);
});

document.addEventListener("submit", (event) => {
  const form = event.target;
  if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
    event.preventDefault();
    event.stopImmediatePropagation();
  }
}, true);

document.addEventListener("htmx:xhr:progress", (event) => {
  const form = event.target.closest("form");
  const bar = form && form.querySelector("progress[data-upload]");
  if (bar && event.detail.lengthComputable) {
    bar.max = event.detail.total;
    bar.value = event.detail.loaded;
    bar.hidden = false;
  }
});
