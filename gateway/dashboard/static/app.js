// mcp-gateway dashboard: small enhancements; every page works without them.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  // The workspace switcher switches as soon as another workspace is chosen.
  for (const select of document.querySelectorAll("select[data-autosubmit]")) {
    select.addEventListener("change", () => select.form.submit());
  }
  for (const button of document.querySelectorAll("[data-hide-with-js]")) {
    button.hidden = true;
  }

  // Copy buttons (the API key shown once).
  for (const button of document.querySelectorAll("button[data-copy]")) {
    button.hidden = false;
    button.addEventListener("click", async () => {
      const source = document.getElementById(button.dataset.copy);
      try {
        await navigator.clipboard.writeText(source.value || source.textContent);
        button.textContent = "Copied";
      } catch {
        source.select?.();
        button.textContent = "Press Ctrl+C to copy";
      }
    });
  }

  // A scope's servers: checking one means "only these"; "all servers" unchecks them (the
  // server refuses both at once, as it cannot tell which was meant).
  for (const fieldset of document.querySelectorAll("fieldset[data-servers]")) {
    const all = fieldset.querySelector('input[name="servers"][value="all"]');
    const only = fieldset.querySelector('input[name="servers"][value="only"]');
    const boxes = fieldset.querySelectorAll('input[name="allowed_servers"]');
    for (const box of boxes) {
      box.addEventListener("change", () => { if (box.checked) only.checked = true; });
    }
    all.addEventListener("change", () => { for (const box of boxes) box.checked = false; });
  }

  // Destructive buttons ask first.
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  }
});
