"use strict";
const history = [];
let lastPublished = null, lastAt = null;
const $ = (id) => document.getElementById(id);
const text = (value) => document.createTextNode(value == null ? "–" : String(value));
const age = (s) => s == null ? "–" : s < 60 ? s.toFixed(1) + " s" : (s / 60).toFixed(1) + " min";
// The token field's value as a bearer header: reads need it when the relay says so (a read
// token is set, or the relay listens beyond loopback), actions always.
const auth = () => $("token").value ? { authorization: "Bearer " + $("token").value } : {};
// A value the listing cut ends with an ellipsis.
const shown = (d, field) => (d[field] == null ? d[field] : d[field] + ((d.truncated || []).includes(field) ? "…" : ""));

async function read(path) {
  const r = await fetch(path, { headers: auth() });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || "HTTP " + r.status);
  return body;
}

function cell(row, value, cls) {
  const td = document.createElement("td");
  if (cls) td.className = cls;
  td.appendChild(text(value));
  row.appendChild(td);
  return td;
}

function draw() {
  const c = $("chart"), g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  if (history.length < 2) return;
  const series = [["pending", "#2563eb"], ["oldest", "#d97706"]];
  for (const [key, color] of series) {
    const max = Math.max(1, ...history.map((h) => h[key] || 0));
    g.strokeStyle = color; g.lineWidth = 2; g.beginPath();
    history.forEach((h, i) => {
      const x = (i / (history.length - 1)) * (c.width - 10) + 5;
      const y = c.height - 5 - ((h[key] || 0) / max) * (c.height - 20);
      i ? g.lineTo(x, y) : g.moveTo(x, y);
    });
    g.stroke();
    g.fillStyle = color; g.fillText(key + " max " + Math.round(max), 8, key === "pending" ? 14 : 28);
  }
}

async function refresh() {
  try {
    const s = await read("api/status");
    $("pending").textContent = s.pending;
    $("oldest").textContent = age(s.oldest_pending_age_seconds);
    $("dead").textContent = s.dead;
    $("dead").className = "value" + (s.dead > 0 ? " bad" : "");
    $("published").textContent = s.published_total;
    $("failed").textContent = s.failed_total;
    const now = Date.now();
    if (lastPublished != null) $("rate").textContent = Math.max(0, (s.published_total - lastPublished) / ((now - lastAt) / 1000)).toFixed(0);
    lastPublished = s.published_total; lastAt = now;
    history.push({ pending: s.pending, oldest: s.oldest_pending_age_seconds || 0 });
    if (history.length > 300) history.shift();
    draw();
    const parts = $("partitions"); parts.replaceChildren();
    for (const p of s.partitions) {
      const tr = document.createElement("tr");
      cell(tr, p.partition); cell(tr, p.owner); cell(tr, p.epoch); cell(tr, p.live ? "live" : "free");
      cell(tr, p.pending); cell(tr, age(p.oldest_age_seconds));
      parts.appendChild(tr);
    }
    const dead = await read("api/dead-letters?limit=200");
    const body = $("dead-letters"); body.replaceChildren();
    for (const d of dead) {
      const tr = document.createElement("tr");
      tr.dataset.id = d.id;
      cell(tr, d.id); cell(tr, shown(d, "event_type")); cell(tr, shown(d, "aggregate_type") + "/" + shown(d, "aggregate_id"));
      cell(tr, d.attempts); cell(tr, d.parked ? "yes" : "no"); cell(tr, shown(d, "last_error"), "error-text").title = shown(d, "last_error");
      const actions = cell(tr, "");
      for (const action of ["replay", "skip"]) {
        const b = document.createElement("button");
        b.className = action; b.textContent = action;
        b.onclick = () => act(action, d.id);
        actions.appendChild(b);
      }
      body.appendChild(tr);
    }
    $("updated").textContent = "updated " + new Date().toLocaleTimeString() + (s.writable ? "" : " · read-only");
  } catch (e) {
    $("updated").textContent = "cannot read from the relay: " + e.message;
  }
}

async function act(action, id) {
  const reason = $("reason").value || action + " from the dashboard";
  const r = await fetch("api/dead-letters/" + action, {
    method: "POST",
    headers: { "content-type": "application/json", ...auth() },
    body: JSON.stringify({ ids: [id], reason }),
  });
  const body = await r.json().catch(() => ({}));
  $("message").textContent = r.ok ? action + " of " + id + ": done (" + JSON.stringify(body) + ")" : action + " refused: " + (body.error || r.status);
  refresh();
}

$("token").addEventListener("change", refresh);
refresh();
setInterval(refresh, 2000);
