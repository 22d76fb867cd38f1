// The operator console: a client of /v1 and nothing else. The API key lives in this tab's
// session storage only (never in a URL or a cookie); live updates come from the event stream
// opened with a single-use stream token. Every value from the API is written with textContent.
"use strict";

const KEY = "capstan.apiKey";
const STATUSES = ["queued", "running", "waiting", "paused", "succeeded", "failed", "canceled", "rolled_back"];
const ACTIVE = ["queued", "running", "waiting", "paused"];
// Workflows that may be resumed after they failed or were canceled (they declare it).
const RESUMABLE_WHEN_FAILED = ["update-function-version"];
const RETRY_FINALIZATION = ["onboard-domain", "add-certificate"];

const main = () => document.getElementById("main");
const key = () => sessionStorage.getItem(KEY);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// An API error as the API gave it, with what a 401/403 means for the person reading it.
class ApiError extends Error {
  constructor(status, body) {
    const code = (body && body.error) || "error";
    const reason = body && body.reason ? ` (${body.reason})` : "";
    super(`${status} ${code}${reason}: ${(body && body.message) || "no message"}`);
    this.status = status;
    this.body = body || {};
  }
  explain() {
    if (this.status === 403) return "This key's principal lacks that permission. An operator can grant it with `capstan principals grant <principal> <permission>`.";
    if (this.status === 401) return "The key is missing, expired or revoked: sign in again with a valid key.";
    if (this.body.issues) return this.body.issues.map((i) => `${i.path}: ${i.message}`).join("; ");
    return null;
  }
}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${key()}` };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await r.text();
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch { json = { error: "invalid_response", message: text.slice(0, 200) }; }
  if (!r.ok) throw new ApiError(r.status, json);
  return json;
}

// `replaceChildren` without the absent parts (it would write `null` as text).
function show(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
}

// Replaces a part of the page only when what it shows has changed, so a live refresh does not swap
// a button out from under the operator's pointer between press and release.
function showChanged(node, key, ...children) {
  if (node.dataset.shown === key) return;
  node.dataset.shown = key;
  show(node, ...children);
}

function errorBox(e) {
  const box = el("div", { class: "error", role: "alert" }, el("div", { text: e.message }));
  if (e instanceof ApiError && e.explain()) box.append(el("div", { class: "hint", text: e.explain() }));
  return box;
}

function toast(text) {
  const t = document.getElementById("toast");
  t.textContent = text;
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, 4000);
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "";
}

function duration(start, end) {
  if (!start) return "";
  const ms = (end ? new Date(end) : new Date()) - new Date(start);
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.floor(ms / 60000)} min ${Math.round((ms % 60000) / 1000)} s`;
}

const badge = (status) => el("span", { class: `status ${status}`, "data-status": status, text: status.replace("_", " ") });

// --- live updates -------------------------------------------------------------------------

const live = { source: null, retry: null, listeners: new Set(), names: null, poll: null };

// The stream names each event `<EventType>.v<N>`: the catalog lists them all.
async function eventNames() {
  if (!live.names) {
    const r = await fetch("/v1/events/catalog");
    const { events } = await r.json();
    live.names = events.map((e) => `${e.eventType}.v${e.eventVersion}`);
  }
  return live.names;
}

async function connectLive() {
  if (live.source || !key()) return;
  const indicator = document.getElementById("live");
  try {
    const names = await eventNames();
    const { token } = await api("POST", "/v1/streams/token");
    const source = new EventSource(`/v1/streams/events?token=${encodeURIComponent(token)}`);
    live.source = source;
    const moved = () => live.listeners.forEach((f) => f());
    source.onopen = () => indicator.classList.add("on");
    for (const name of [...names, "resync"]) source.addEventListener(name, moved);
    source.onerror = () => {
      // A token opens one stream: a dropped stream needs a new one.
      indicator.classList.remove("on");
      source.close();
      live.source = null;
      clearTimeout(live.retry);
      live.retry = setTimeout(connectLive, 2000);
    };
  } catch (e) {
    indicator.classList.remove("on");
    indicator.title = e.message;
  }
}

// Calls `refresh` (at most every 300 ms) when any event arrives, until the view changes.
function onLive(refresh) {
  let timer = null;
  live.listeners.clear();
  live.listeners.add(() => { clearTimeout(timer); timer = setTimeout(refresh, 300); });
}

// --- views ----------------------------------------------------------------------------------

function signIn(message) {
  document.getElementById("nav").hidden = true;
  const input = el("input", { id: "api-key", type: "password", autocomplete: "off", placeholder: "cap_...", required: true, size: 44 });
  const form = el("form", { class: "signin", id: "signin" },
    el("label", {}, "API key", input),
    el("button", { class: "primary", type: "submit", text: "Sign in" }));
  const out = el("div");
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, input.value.trim());
    try {
      await api("GET", "/v1/executions?limit=1");
      start();
    } catch (e) {
      sessionStorage.removeItem(KEY);
      out.replaceChildren(errorBox(e));
    }
  });
  show(main(),
    el("h1", { text: "Sign in" }),
    el("p", { class: "hint", text: "The key stays in this tab's session storage and is sent only to this server's API." }),
    message ? el("div", { class: "error", text: message }) : null,
    form, out);
  input.focus();
}

async function executionsView(params) {
  const workflow = params.get("workflow") || "";
  const status = params.get("status") || "";
  const principal = params.get("principalId") || "";
  const form = el("form", { class: "filters", id: "filters" },
    el("label", {}, "Workflow", el("input", { name: "workflow", value: workflow, placeholder: "any" })),
    el("label", {}, "Status", el("select", { name: "status" },
      el("option", { value: "", text: "any" }),
      STATUSES.map((s) => el("option", { value: s, selected: s === status, text: s.replace("_", " ") })))),
    el("label", {}, "Principal", el("input", { name: "principalId", value: principal, placeholder: "any" })),
    el("button", { type: "submit", text: "Filter" }));
  form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const q = new URLSearchParams();
    for (const [k, v] of new FormData(form)) if (v) q.set(k, v);
    location.hash = `#/?${q}`;
  });
  const body = el("div", { id: "executions" });
  main().replaceChildren(el("h1", { text: "Executions" }), form, body);

  const load = async () => {
    const q = new URLSearchParams({ limit: "50" });
    if (workflow) q.set("workflow", workflow);
    if (status) q.set("status", status);
    if (principal) q.set("principalId", principal);
    try {
      const { executions } = await api("GET", `/v1/executions?${q}`);
      if (!executions.length) {
        showChanged(body, "[]", el("p", { class: "hint", text: "No executions match." }));
        return;
      }
      showChanged(body, JSON.stringify(executions), el("div", { class: "table-wrap" }, el("table", {},
        el("thead", {}, el("tr", {}, ["Execution", "Workflow", "Status", "Stage", "Principal", "Created"].map((h, i) =>
          el("th", { class: i >= 4 ? "hide-narrow" : null, text: h })))),
        el("tbody", {}, executions.map((x) => el("tr", { "data-execution": x.executionId },
          el("td", {}, el("a", { href: `#/executions/${x.executionId}`, class: "mono", text: x.executionId.slice(0, 13) + "…" })),
          el("td", { text: x.workflow }),
          el("td", {}, badge(x.status)),
          el("td", { text: x.currentStage || "" }),
          el("td", { class: "hide-narrow", text: x.principalId }),
          el("td", { class: "hide-narrow", text: when(x.createdAt) })))))));
    } catch (e) {
      if (e.status === 401) return signIn(e.message);
      delete body.dataset.shown;
      body.replaceChildren(errorBox(e));
    }
  };
  onLive(load);
  await load();
}

function outcomeCard(o) {
  const item = (label, value) => el("div", {}, el("span", { class: "label", text: label }), value);
  const state = (s) => (s ? badge(s) : "");
  const dist = (d) => el("span", {}, state(d.state), " ", el("code", { text: d.id || "" }));
  const card = el("div", { class: "card", id: "outcome" },
    el("h2", { text: `Outcome: ${o.status}` }),
    el("div", { class: "grid" },
      item("Domain", el("span", {}, el("b", { text: o.domain.name }), " ", state(o.domain.state))),
      item("Certificate", el("span", {}, state(o.certificate.state), " ", el("code", { text: o.certificate.arn || "" }))),
      item("Proxy distribution", dist(o.distributions.proxy)),
      item("CMS distribution", dist(o.distributions.cms)),
      item("Maps keys", el("span", {}, state(o.mapsProvider.outcome), ` ${(o.mapsProvider.keys || []).map((k) => `${k.displayName}: ${k.state}`).join(", ")}`)),
      item("Ticket", el("span", {}, state(o.ticketing.state), ` ${o.ticketing.ticketId || ""}`)),
      item("Cleanup", state(o.cleanup.state))));
  const reasons = (o.assistance && o.assistance.reasons) || [];
  if (reasons.length) {
    card.append(el("h2", { text: "Assistance needed" }), el("ul", {}, reasons.map((r) =>
      el("li", {}, el("b", { text: r.code }), ` (${r.audience}): ${r.action}`, el("div", { class: "hint", text: r.message })))));
  }
  return card;
}

// What the caller may do now, from the execution's status and workflow (the API decides in the
// end: a refusal is shown as it answers).
function actionsFor(x) {
  const out = [];
  if (ACTIVE.includes(x.status)) out.push(["cancel", "Cancel", "danger", "Cancel this execution? A running stage stops at its next host call."]);
  if (x.status === "paused" || (["failed", "canceled"].includes(x.status) && RESUMABLE_WHEN_FAILED.includes(x.workflow))) {
    out.push(["resume", "Resume", "primary", "Resume this execution from where it stopped?"]);
  }
  if (x.status === "failed" && RETRY_FINALIZATION.includes(x.workflow)) {
    out.push(["retry-finalization", "Retry finalization", "", "Run the finalize stage again (earlier stages are replayed, not repeated)?"]);
  }
  if (x.status === "succeeded" && x.workflow === "onboard-domain" && x.outcome && x.outcome.mapsProvider.outcome === "manual-required") {
    out.push(["retry-maps-whitelist", "Retry maps whitelist", "", "Run maps-whitelist and the stages after it again?"]);
  }
  const finished = ["succeeded", "failed", "canceled"].includes(x.status);
  if (finished || (x.status === "paused" && x.workflow !== "update-function-version")) {
    out.push(["rollback", "Roll back", "danger", "Undo every change this execution made, newest first, from its receipts?"]);
  }
  return out;
}

async function planView(x, box) {
  try {
    const plan = await api("GET", `/v1/executions/${x.executionId}/plan`);
    const approve = el("button", { class: "primary", id: "approve-plan", type: "button", text: "Approve this plan" });
    approve.addEventListener("click", async () => {
      if (!confirm(`Apply ${plan.items.length} change(s) to ${plan.rootDomain}? Plan ${plan.planHash.slice(0, 12)}…`)) return;
      approve.disabled = true;
      try {
        await api("POST", `/v1/executions/${x.executionId}/plan/approve`, { planHash: plan.planHash });
        toast("Plan approved");
      } catch (e) {
        box.append(errorBox(e));
        approve.disabled = false;
      }
    });
    const current = (c) => (c ? [c.type_ || c.type || "", (c.values || []).join(" "), c.aliasTarget ? `alias ${c.aliasTarget.dnsName}` : ""].join(" ").trim() : "—");
    showChanged(box, JSON.stringify([plan, x.status]), el("div", { class: "card", id: "plan" },
      el("h2", { text: `Plan for ${plan.rootDomain}` }),
      el("p", { class: "hint" }, "Hash ", el("code", { text: plan.planHash })),
      el("div", { class: "table-wrap" }, el("table", {},
        el("thead", {}, el("tr", {}, ["Hostname", "Disposition", "Current", "New"].map((h) => el("th", { text: h })))),
        el("tbody", {}, plan.items.map((i) => el("tr", {},
          el("td", { text: i.hostname }), el("td", { text: i.disposition }),
          el("td", { class: "mono", text: current(i.current) }),
          el("td", { class: "mono", text: plan.apexAlias ? `alias ${plan.apexAlias.dnsName}` : "" })))))),
      x.status === "waiting" ? el("div", { class: "actions" }, approve) : null));
  } catch (e) {
    delete box.dataset.shown;
    if (e.status === 404) box.replaceChildren();
    else box.replaceChildren(errorBox(e));
  }
}

async function executionView(id) {
  const head = el("div");
  const actions = el("div", { class: "actions", id: "actions" });
  const messages = el("div");
  const plan = el("div");
  const outcome = el("div");
  const stages = el("div");
  const events = el("div");
  const receipts = el("div");
  main().replaceChildren(el("p", {}, el("a", { href: "#/", text: "← Executions" })), head, messages, actions, plan, outcome, stages, receipts, events);

  const act = async (command, label, confirmText) => {
    if (!confirm(confirmText)) return;
    try {
      const answer = await api("POST", `/v1/executions/${id}/${command}`);
      toast(`${label}: ${answer.status || (answer.command && answer.command.status) || (answer.execution && answer.execution.status) || "accepted"}`);
      messages.replaceChildren();
      load();
    } catch (e) {
      messages.replaceChildren(errorBox(e));
    }
  };

  const load = async () => {
    let x;
    try {
      x = await api("GET", `/v1/executions/${id}`);
    } catch (e) {
      if (e.status === 401) return signIn(e.message);
      head.replaceChildren(errorBox(e));
      return;
    }
    head.replaceChildren(
      el("h1", {}, `${x.workflow} `, badge(x.status)),
      el("p", { class: "hint" }, el("code", { text: x.executionId }), ` · by ${x.principalId} · created ${when(x.createdAt)}`,
        x.finishedAt ? ` · finished ${when(x.finishedAt)}` : "",
        x.cancellationRequestedAt ? ` · cancel requested ${when(x.cancellationRequestedAt)}` : ""),
      el("details", {}, el("summary", { text: "Input" }), el("pre", { text: JSON.stringify(x.inputJson, null, 2) })));
    const offered = actionsFor(x);
    showChanged(actions, JSON.stringify(offered), offered.map(([command, label, cls, text]) => {
      const b = el("button", { type: "button", class: cls || null, "data-action": command, text: label });
      b.addEventListener("click", () => act(command, label, text));
      return b;
    }));
    if (x.workflow === "add-subdomain") await planView(x, plan);
    show(outcome, x.outcome ? outcomeCard(x.outcome) : null);
    stages.replaceChildren(el("h2", { text: "Stages" }), el("div", { class: "table-wrap" }, el("table", { id: "stages" },
      el("thead", {}, el("tr", {}, ["Stage", "Status", "Started", "Duration", "Output / error"].map((h) => el("th", { text: h })))),
      el("tbody", {}, x.stages.map((s) => el("tr", { "data-stage": s.stageName },
        el("td", { text: s.stageName }), el("td", {}, badge(s.status)),
        el("td", { text: when(s.startedAt) }), el("td", { text: duration(s.startedAt, s.finishedAt) }),
        el("td", {}, s.errorJson ? el("pre", { class: "error", text: JSON.stringify(s.errorJson, null, 2) }) :
          s.outputJson !== undefined ? el("details", {}, el("summary", { text: "output" }), el("pre", { text: JSON.stringify(s.outputJson, null, 2) })) : "")))))));
    try {
      const { receipts: list } = await api("GET", `/v1/executions/${id}/receipts`);
      const undo = (r) => (r.undo === "call" ? `${r.undoOp}` : r.undo === "irreversible" ? `irreversible: ${r.undoNote}` : "nothing to undo");
      show(receipts, list.length ? [el("h2", { text: "Receipts" }),
        el("p", { class: "hint", text: "What each change did; a rollback undoes them newest first." }),
        table("receipts", ["Change", "Made", "Rollback", "Undone", "Details"], list.map((r) => el("tr", { "data-op": r.op },
          el("td", { class: "mono", text: r.op }), el("td", { text: when(r.createdAt) }),
          el("td", { class: "mono", text: undo(r) }), el("td", { text: when(r.compensatedAt) }),
          el("td", {}, el("details", {}, el("summary", { text: "request / response" }),
            el("pre", { text: JSON.stringify({ request: r.request, response: r.response }, null, 2) }))))))] : null);
    } catch (e) {
      receipts.replaceChildren(errorBox(e));
    }
    try {
      const { events: list } = await api("GET", `/v1/executions/${id}/events`);
      events.replaceChildren(el("h2", { text: "Events" }), el("div", { class: "table-wrap" }, el("table", { id: "events" },
        el("thead", {}, el("tr", {}, ["Event", "At", "Payload"].map((h) => el("th", { text: h })))),
        el("tbody", {}, list.map((ev) => el("tr", {},
          el("td", { text: `${ev.eventType}.v${ev.eventVersion}` }), el("td", { text: when(ev.occurredAt || ev.createdAt) }),
          el("td", {}, el("details", {}, el("summary", { text: "payload" }), el("pre", { text: JSON.stringify(ev.payload, null, 2) })))))))));
    } catch (e) {
      events.replaceChildren(errorBox(e));
    }
  };
  onLive(load);
  await load();
}

// --- the node, subscriptions, events, audit ------------------------------------------------

function table(id, headers, rows) {
  return el("div", { class: "table-wrap" }, el("table", { id },
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", { text: h })))),
    el("tbody", {}, rows)));
}

// The loaded workflows and the providers behind their capabilities, from `/readyz`.
async function workflowsView() {
  live.listeners.clear();
  const body = el("div");
  main().replaceChildren(el("h1", { text: "Workflows and providers" }), body);
  try {
    const r = await fetch("/readyz");
    const ready = await r.json();
    show(body,
      el("p", { class: "hint" }, `Node ${ready.status}, database ${ready.database}.`),
      table("workflows", ["Workflow", "Version", "Digest", "Stages", "Capabilities"], ready.workflows.map((w) => el("tr", { "data-workflow": w.name },
        el("td", {}, el("a", { href: `#/?workflow=${encodeURIComponent(w.name)}`, text: w.name })),
        el("td", { text: w.version }),
        el("td", { class: "mono", title: w.digest, text: `${w.digest.slice(0, 19)}…` }),
        el("td", { text: w.stages.join(" → ") }),
        el("td", { text: w.capabilities.map((c) => `${c.name} (${c.implementation})`).join(", ") })))),
      el("h2", { text: "Real providers" }),
      ready.providers.length
        ? table("providers", ["Capability", "Kind", "Status"], ready.providers.map((p) => el("tr", {},
          el("td", { text: p.capability }), el("td", { text: p.kind }), el("td", { text: p.status }))))
        : el("p", { class: "hint", text: "None configured: every capability is served by the simulated cloud." }),
      ready.failedWorkflows.length
        ? el("div", {}, el("h2", { text: "Files that failed to load" }),
          table("failed", ["File", "Error"], ready.failedWorkflows.map((f) => el("tr", {},
            el("td", { class: "mono", text: f.file }), el("td", { text: f.error })))))
        : null);
  } catch (e) {
    body.replaceChildren(errorBox(e));
  }
}

async function catalogView() {
  live.listeners.clear();
  const body = el("div");
  main().replaceChildren(el("h1", { text: "Event catalog" }), body);
  try {
    const { events } = await (await fetch("/v1/events/catalog")).json();
    body.replaceChildren(table("catalog", ["Event", "State", "Description"], events.map((e) => el("tr", {},
      el("td", { class: "mono", text: `${e.eventType}.v${e.eventVersion}` }),
      el("td", { text: e.state || "" }),
      el("td", { text: e.description || "" })))));
  } catch (e) {
    body.replaceChildren(errorBox(e));
  }
}

async function auditView() {
  live.listeners.clear();
  const body = el("div");
  main().replaceChildren(el("h1", { text: "Audit log" }), body);
  try {
    const { auditLogs } = await api("GET", "/v1/audit-logs?limit=100");
    body.replaceChildren(table("audit", ["At", "Principal", "Action", "Result", "Route", "Resource"], auditLogs.map((a) => el("tr", {},
      el("td", { text: when(a.at) }), el("td", { text: a.principalId }), el("td", { text: a.action }),
      el("td", {}, el("span", { class: `status ${a.result === "allowed" ? "succeeded" : "failed"}`, text: a.result })),
      el("td", { class: "mono", text: `${a.method} ${a.route}` }), el("td", { class: "mono", text: a.resource })))));
  } catch (e) {
    if (e.status === 401) return signIn(e.message);
    body.replaceChildren(errorBox(e));
  }
}

async function subscriptionsView() {
  live.listeners.clear();
  const body = el("div");
  main().replaceChildren(el("h1", { text: "Webhook subscriptions" }), body);
  try {
    const { subscriptions } = await api("GET", "/v1/subscriptions");
    if (!subscriptions.length) {
      body.replaceChildren(el("p", { class: "hint", text: "No subscriptions (POST /v1/subscriptions makes one; see docs/events.md)." }));
      return;
    }
    body.replaceChildren(table("subscriptions", ["URL", "Events", "Health", "Created"], subscriptions.map((sub) => el("tr", {},
      el("td", {}, el("a", { href: `#/subscriptions/${sub.id}`, class: "mono", text: sub.url })),
      el("td", { text: sub.events.join(", ") }),
      el("td", { text: sub.health }), el("td", { text: when(sub.createdAt) })))));
  } catch (e) {
    if (e.status === 401) return signIn(e.message);
    body.replaceChildren(errorBox(e));
  }
}

async function deliveriesView(id) {
  const messages = el("div");
  const body = el("div");
  main().replaceChildren(el("p", {}, el("a", { href: "#/subscriptions", text: "← Subscriptions" })),
    el("h1", { text: "Deliveries" }), messages, body);
  const load = async () => {
    try {
      const { deliveries } = await api("GET", `/v1/subscriptions/${encodeURIComponent(id)}/deliveries`);
      showChanged(body, JSON.stringify(deliveries), table("deliveries", ["Event", "Attempt", "Status", "Response", "Dispatched", "Error", ""], deliveries.map((d) => {
        const again = el("button", { type: "button", text: "Redeliver" });
        again.addEventListener("click", async () => {
          if (!confirm(`Deliver event ${d.eventId} to this subscription again?`)) return;
          try {
            await api("POST", `/v1/subscriptions/${encodeURIComponent(id)}/redeliver/${encodeURIComponent(d.eventId)}`);
            toast("Redelivery queued");
            load();
          } catch (e) {
            messages.replaceChildren(errorBox(e));
          }
        });
        return el("tr", {},
          el("td", { class: "mono", text: d.eventId }), el("td", { text: d.attempt }), el("td", { text: d.status }),
          el("td", { text: d.responseCode ?? "" }), el("td", { text: when(d.dispatchedAt) }),
          el("td", { text: d.lastError || "" }), el("td", {}, again));
      })));
    } catch (e) {
      if (e.status === 401) return signIn(e.message);
      delete body.dataset.shown;
      body.replaceChildren(errorBox(e));
    }
  };
  onLive(load);
  // Delivery attempts are not events on the stream: the page asks again every few seconds.
  live.poll = setInterval(load, 5000);
  await load();
}

function route() {
  clearInterval(live.poll);
  if (!key()) return signIn();
  document.getElementById("nav").hidden = false;
  connectLive();
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const m = path.match(/^\/executions\/([^/]+)$/);
  if (m) return executionView(decodeURIComponent(m[1]));
  const sub = path.match(/^\/subscriptions\/([^/]+)$/);
  if (sub) return deliveriesView(decodeURIComponent(sub[1]));
  if (path === "/workflows") return workflowsView();
  if (path === "/events") return catalogView();
  if (path === "/audit") return auditView();
  if (path === "/subscriptions") return subscriptionsView();
  return executionsView(new URLSearchParams(query || ""));
}

function start() {
  if (!location.hash) location.hash = "#/";
  route();
}

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", () => {
  document.getElementById("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    if (live.source) live.source.close();
    live.source = null;
    location.hash = "#/";
    signIn();
  });
  start();
});
