// hctx web: what both pages share. Every value arrives worded by the server (the same renderer
// `hctx agents` uses): this only places text and class names, and only ever as text.
"use strict";

window.hctx = {
  // The meter chip: the harness's percent, its tint, titled `170k of 200k tokens`; no number when
  // the harness withheld the percent, no chip without a reading.
  chip(view) {
    const chip = document.createElement("span");
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
    return chip;
  },

  // The context cell: the chip, or why there is no reading (a refused record says so).
  context(cell, view) {
    cell.replaceChildren(hctx.chip(view));
    if (view.problem) {
      const reason = document.createElement("div");
      reason.className = "reason";
      reason.textContent = view.problem;
      cell.append(reason);
    }
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
