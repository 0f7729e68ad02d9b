// hctx web: the fleet page. One snapshot, then only what changed, from /api/events.
"use strict";

(() => {
  const main = document.getElementById("board");
  const body = document.querySelector("#fleet .rows");
  const limitsBody = document.querySelector("#limits tbody");
  const sortSelect = document.getElementById("sort");
  const filterBox = document.getElementById("filter");
  // A phone reads the fleet as cards, fullest first (board.css's narrow layout).
  if (window.matchMedia("(max-width: 640px)").matches) sortSelect.value = "fill";
  const shown = new Map(); // key -> {view, element, cells}
  let updates = 0;

  const COLUMNS = ["host", "agent", "harness", "model", "context", "tokens", "headroom", "compactions", "age",
    "cost", "cache", "state"];
  // The prompt cache's countdown rides the ages under its agent's key and this (board.CACHE_TICK).
  const CACHE_TICK = "\tcache";

  // One row built by hand, then cloned: a thousand rows cost a thousand clones, not 13,000 calls.
  const template = document.createElement("div");
  template.className = "row";
  template.setAttribute("role", "row");
  for (const name of COLUMNS) {
    const cell = document.createElement("span");
    cell.className = name;
    cell.setAttribute("role", "cell");
    template.append(cell);
  }
  template.querySelector(".agent").append(document.createElement("a"));

  function build(view) {
    const element = template.cloneNode(true);
    element.dataset.key = view.key;
    const cells = {};
    COLUMNS.forEach((name, index) => { cells[name] = element.children[index]; });
    cells.link = cells.agent.firstChild;
    return { view, element, cells };
  }

  function fill(entry, view) {
    const c = entry.cells;
    c.host.textContent = view.agent.host;
    c.link.textContent = view.agent.identity;
    c.link.href = hctx.agentHref(view);
    c.harness.textContent = view.harness;
    c.model.textContent = view.model;
    hctx.context(c.context, view);
    c.tokens.textContent = view.meter;
    c.headroom.textContent = view.headroom;
    c.compactions.textContent = view.compactions;
    hctx.age(c.age, view.age, view.stale);
    c.cost.textContent = view.cost;
    c.cache.textContent = view.cache;
    c.state.textContent = view.state;
    subagents(entry.element, view.subagents || []);
    entry.view = view;
    entry.element.hidden = !matches(view);
  }

  // `hctx top`'s filter: a substring of the host, harness or name, in any case.
  function matches(view) {
    const needle = filterBox.value.trim().toLowerCase();
    if (!needle) return true;
    return [view.agent.host, view.harness, view.agent.identity].some((text) => text.toLowerCase().includes(needle));
  }

  function filter() {
    for (const entry of shown.values()) entry.element.hidden = !matches(entry.view);
    summary();
  }

  // Each subagent a line under its agent's row (issue 28), its own chip and numbers; its cells are
  // `sub-*` so nothing selecting the agent's own cells ever finds a subagent's.
  const SUB_COLUMNS = ["host", "agent", "harness", "model", "context", "tokens", "headroom", "compactions", "age",
    "cost", "cache", "state"];

  function subagents(element, subs) {
    let box = element.querySelector(".subagents");
    if (subs.length === 0) {
      if (box) box.remove();
      return;
    }
    if (!box) {
      box = document.createElement("div");
      box.className = "subagents";
      element.append(box);
    }
    box.replaceChildren(...subs.map((sub) => {
      const line = document.createElement("div");
      line.className = "subagent";
      line.setAttribute("role", "row");
      line.dataset.key = sub.key;
      const cells = {};
      for (const name of SUB_COLUMNS) {
        cells[name] = document.createElement("span");
        cells[name].className = "sub-" + name;
        line.append(cells[name]);
      }
      cells.agent.textContent = sub.label;
      cells.harness.textContent = sub.state;
      cells.model.textContent = sub.model;
      hctx.context(cells.context, sub);
      cells.tokens.textContent = sub.meter;
      cells.compactions.textContent = sub.compactions;
      cells.age.textContent = sub.age;
      return line;
    }));
  }

  function compare(a, b) {
    for (let i = 0; i < Math.min(a.length, b.length); i++) {
      if (a[i] < b[i]) return -1;
      if (a[i] > b[i]) return 1;
    }
    return a.length - b.length;
  }

  function order() {
    const by = sortSelect.value;
    const entries = [...shown.values()];
    if (by === "host") entries.sort((x, y) => compare([x.view.agent.host, x.view.agent.identity],
      [y.view.agent.host, y.view.agent.identity]));
    else entries.sort((x, y) => compare(x.view.order[by], y.view.order[by]));
    let previous = null;
    for (const entry of entries) { // moves only what is out of place
      const expected = previous ? previous.nextSibling : body.firstChild;
      if (entry.element !== expected) body.insertBefore(entry.element, expected);
      previous = entry.element;
    }
  }

  // A view the row already shows is not filled again: a snapshot after a reconnect touches only
  // the rows that moved.
  function upsert(view) {
    let entry = shown.get(view.key);
    if (!entry) {
      entry = build(view);
      shown.set(view.key, entry);
    } else if (JSON.stringify(entry.view) === JSON.stringify(view)) {
      return;
    }
    fill(entry, view);
  }

  const PANEL_AGE = 6;  // the index of item.age's cell in a panel row

  function panel(data) {
    if (!data) return;
    const rows = data.entries.map((item) => {
      const tr = document.createElement("tr");
      for (const value of [item.account, item.key, item.harness, item.fiveHour, item.sevenDay, item.agents, item.age,
                           item.runsOutFiveHour ?? "-", item.runsOutSevenDay ?? "-"]) {
        const td = document.createElement("td");
        td.textContent = value;
        tr.append(td);
      }
      // Each window over the kept hours (wrapper.readers.web.board.limits_svg: numbers only, built by the server).
      const plot = document.createElement("td");
      plot.className = "limits-plot";
      if (item.plot) {
        // An HTML fragment: the HTML parser puts <svg> in the SVG namespace; a parsed document runs nothing.
        const svg = new DOMParser().parseFromString(item.plot, "text/html").body.firstElementChild;
        if (svg) plot.append(document.importNode(svg, true));
      }
      tr.append(plot);
      tr.dataset.key = item.key;
      return tr;
    });
    limitsBody.replaceChildren(...rows);
    document.getElementById("limits-none").hidden = rows.length > 0;
    const more = document.getElementById("limits-more");
    more.hidden = data.more === 0;
    more.textContent = `and ${data.more} more accounts`;
  }

  // `hctx top`'s summary, of the whole fleet: how many at or above 80% and 95% (the server's tints
  // are those thresholds), how many stale, agents per host; and how many the filter shows.
  function summary() {
    const count = shown.size;
    const hosts = new Map();
    let amber = 0, red = 0, stale = 0, hidden = 0;
    for (const entry of shown.values()) {
      const view = entry.view;
      hosts.set(view.agent.host, (hosts.get(view.agent.host) || 0) + 1);
      if (view.tint === "amber" || view.tint === "red") amber += 1;
      if (view.tint === "red") red += 1;
      if (view.stale) stale += 1;
      if (entry.element.hidden) hidden += 1;
    }
    const filtered = hidden ? ` · ${count - hidden} shown` : "";
    document.getElementById("summary").textContent = `${count} agent${count === 1 ? "" : "s"}${filtered}`;
    document.getElementById("count-amber").textContent = String(amber);
    document.getElementById("count-red").textContent = String(red);
    document.getElementById("count-stale").textContent = String(stale);
    document.getElementById("count-hosts").textContent = hosts.size === 0 ? "no hosts" : "hosts: "
      + [...hosts].sort((a, b) => compare([a[0]], [b[0]])).map(([host, n]) => `${host} ${n}`).join(", ");
    document.getElementById("empty").hidden = count > 0;
    main.dataset.updates = String(updates);
  }

  function problem(text) { // the catalog cannot be read: said above the rows it last showed
    const line = document.getElementById("problem");
    line.hidden = !text;
    line.textContent = text || "";
  }

  function snapshot(data) {
    problem(data.problem);
    const keys = new Set(data.rows.map((view) => view.key));
    for (const [key, entry] of shown) if (!keys.has(key)) { entry.element.remove(); shown.delete(key); }
    for (const view of data.rows) upsert(view);
    panel(data.panel);
    const warnings = document.getElementById("warnings");
    warnings.hidden = data.warnings.length === 0;
    warnings.querySelector("ul").replaceChildren(...data.warnings.map((text) => {
      const li = document.createElement("li");
      li.textContent = text;
      return li;
    }));
    order();
    summary();
    if (!main.dataset.rendered) { // the first full render, painted: what scripts/bench_web.py times
      requestAnimationFrame(() => { main.dataset.rendered = String(performance.now()); });
    }
  }

  function changed(data) {
    for (const [key, view] of Object.entries(data.rows)) {
      if (view === null) {
        const entry = shown.get(key);
        if (entry) { entry.element.remove(); shown.delete(key); }
      } else {
        upsert(view);
      }
      updates += 1;
    }
    panel(data.panel);
    order();
    summary();
  }

  // An agent's age under its key; a subagent's under its agent's key, a line break and its own.
  function ages(data) {
    for (const [key, text] of Object.entries(data)) {
      const [name, sub] = key.split("\n");
      const entry = shown.get(name);
      if (!entry) continue;
      if (sub === undefined) {
        hctx.age(entry.cells.age, text, entry.view.stale);
        continue;
      }
      if (sub === CACHE_TICK) {
        entry.cells.cache.textContent = text;
        continue;
      }
      for (const line of entry.element.querySelectorAll(".subagent")) {
        if (line.dataset.key === sub) line.querySelector(".sub-age").textContent = text;
      }
    }
    for (const tr of limitsBody.children) {
      // The age is item.age's cell (`panel`), no longer the last: the forecast and the plot follow it.
      if (data[tr.dataset.key] !== undefined) tr.children[PANEL_AGE].textContent = data[tr.dataset.key];
    }
  }

  sortSelect.addEventListener("change", order);
  filterBox.addEventListener("input", filter);
  const first = JSON.parse(document.getElementById("snapshot").textContent);
  snapshot(first);
  // The stream sends a snapshot only if the board changed since the one the page came with.
  const events = new EventSource("/api/events?since=" + encodeURIComponent(first.version));
  events.addEventListener("open", () => hctx.live(true));
  events.addEventListener("error", () => hctx.live(false));
  events.addEventListener("snapshot", (event) => snapshot(JSON.parse(event.data)));
  events.addEventListener("rows", (event) => changed(JSON.parse(event.data)));
  events.addEventListener("ages", (event) => ages(JSON.parse(event.data)));
  events.addEventListener("problem", (event) => problem(JSON.parse(event.data).problem));
})();
