// hctx web: one agent's page. Its detail from the API, refreshed when its record changes.
"use strict";

(() => {
  const parts = location.pathname.split("/").map(decodeURIComponent); // ["", "agents", HOST, AGENT]
  const host = parts[2], identity = parts[3];
  const key = host + "/" + identity;
  const api = "/api/agents/" + encodeURIComponent(host) + "/" + encodeURIComponent(identity);
  const main = document.getElementById("agent");
  let updates = 0;
  let stale = false;
  let pending = null;

  document.getElementById("name").textContent = key;
  document.getElementById("json").href = api;
  document.title = "hctx · " + key;

  function text(id, value) { document.getElementById(id).textContent = value; }

  function show(detail) {
    const view = detail.view;
    hctx.context(document.getElementById("context"), view);
    text("tokens", view.meter || "-");
    text("headroom", view.headroom);
    text("compactions", view.compactions);
    text("harness", view.harness);
    text("model", view.model);
    stale = view.stale;
    hctx.age(document.getElementById("age"), view.age, stale);
    text("cost", view.cost);
    text("cache", view.cache);
    text("state", view.state);
    text("claim", detail.claim.join("\n"));
    text("record", detail.record.join("\n"));
    const plot = document.getElementById("plot");
    if (detail.history.svg) {
      const svg = new DOMParser().parseFromString(detail.history.svg, "image/svg+xml").documentElement;
      plot.replaceChildren(document.importNode(svg, true));
    } else {
      plot.replaceChildren();
    }
    const note = document.getElementById("plot-note");
    note.hidden = !detail.history.note;
    note.textContent = detail.history.note || "";
    main.dataset.updates = String(updates);
    main.dataset.points = String(detail.history.points);
  }

  async function load() {
    const answer = await fetch(api + "/detail", { cache: "no-store" });
    const problem = document.getElementById("problem");
    if (!answer.ok) {
      const body = await answer.json().catch(() => ({ error: answer.statusText }));
      problem.hidden = false;
      problem.textContent = body.error;
      return;
    }
    problem.hidden = true;
    show(await answer.json());
  }

  function reload() { // one fetch at a time; changes that land meanwhile cost one more, not one each
    if (pending) { pending.again = true; return; }
    pending = { again: false };
    load().finally(() => {
      const again = pending.again;
      pending = null;
      if (again) reload();
    });
  }

  const events = new EventSource("/api/events?agent=" + encodeURIComponent(key));
  events.addEventListener("open", () => hctx.live(true));
  events.addEventListener("error", () => hctx.live(false));
  events.addEventListener("snapshot", reload);
  events.addEventListener("rows", () => { updates += 1; reload(); });
  events.addEventListener("ages", (event) => {
    const ages = JSON.parse(event.data);
    if (ages[key] !== undefined) hctx.age(document.getElementById("age"), ages[key], stale);
    if (ages[key + "\n\tcache"] !== undefined) text("cache", ages[key + "\n\tcache"]);  // board.CACHE_TICK
  });
})();
