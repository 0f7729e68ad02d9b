// hctx web: what both pages share. Every value arrives worded by the server (the same renderer
// `hctx agents` uses): this only places text and class names, and only ever as text.
"use strict";

window.hctx = {
  // The meter chip: the harness's percent, its tint, titled `170k of 200k tokens`; no number when
  // the harness withheld the percent, no chip without a reading. `chip` is the one to redo in
  // place: a chip a person is pointing at stays the same element when its number moves.
  chip(view, chip = document.createElement("span")) {
    chip.className = "chip";
    if (!view.reading) {
      chip.classList.add("withheld");
      chip.textContent = "no reading";
    } else if (view.percent === null) {
      chip.classList.add("withheld");
      chip.textContent = "withheld";
    } else {
      chip.textContent = view.percent;
      if (view.tint) chip.classList.add("tint-" + view.tint);
    }
    if (view.title) chip.title = view.title;
    else chip.removeAttribute("title");
    return chip;
  },

  // The context cell: the chip, or why there is no reading (a refused record says so).
  context(cell, view) {
    const held = cell.querySelector(":scope > .chip");
    const chip = hctx.chip(view, held || undefined);
    if (!held) cell.prepend(chip);
    let reason = cell.querySelector(":scope > .reason");
    if (!view.problem) {
      if (reason) reason.remove();
      return;
    }
    if (!reason) {
      reason = document.createElement("div");
      reason.className = "reason";
      cell.append(reason);
    }
    reason.textContent = view.problem;
  },

  age(cell, text, stale) {
    cell.textContent = text;
    cell.classList.toggle("stale", stale);
  },

  agentHref(view) {
    const a = view.agent;
    return "/agents/" + encodeURIComponent(a.host) + "/" + encodeURIComponent(a.identity);
  },

  live(connected) {
    const badge = document.getElementById("live");
    badge.textContent = connected ? "live" : "reconnecting";
    badge.classList.toggle("off", !connected);
  },
};
