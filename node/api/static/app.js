// The e31 dashboard: reads the node's local API with the same bearer token the CLI uses.
// The token lives in this tab's sessionStorage only; every request sends it as a header, so no
// cookie or other ambient credential exists that another site's page could make the browser send.
// Data from the node (job arguments, reasons, peer addresses) is put in the page as text, never as HTML.

const KEY = "e31-token";
const $ = (id) => document.getElementById(id);
let token = null;
let following = 0; // the generation of the loop that follows the node; signing out or in ends older ones

class SignedOut extends Error {}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

async function api(path) {
  const response = await fetch(path, {
    headers: { Authorization: `Bearer ${token}`, Accept: "application/json" },
    cache: "no-store",
    credentials: "omit",
  });
  if (response.status === 401) throw new SignedOut("the node refused the token");
  if (!response.ok) {
    let message = `HTTP ${response.status}`;
    try { message = (await response.json()).error.message; } catch (e) { /* not JSON */ }
    throw new Error(message);
  }
  return response;
}

const short = (id) => (id ? String(id).slice(0, 12) : "");
const fmtInt = (n) => (n === null || n === undefined ? "" : Number(n).toLocaleString("en"));
const fmtBytes = (n) => (n >= 1 << 30 ? `${(n / (1 << 30)).toFixed(1)} GiB` : `${(n / (1 << 20)).toFixed(0)} MiB`);
const fmtTime = (t) => (t ? new Date(t * 1000).toLocaleTimeString("en-GB") : "");
function fmtSpan(s) {
  if (s === null || s === undefined) return "";
  if (s < 90) return `${s.toFixed(0)} s`;
  if (s < 5400) return `${(s / 60).toFixed(0)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

function fill(tableId, rows, emptyText) {
  const body = $(tableId).tBodies[0];
  body.replaceChildren(...rows);
  if (!rows.length) {
    const cols = $(tableId).tHead.rows[0].cells.length;
    body.append(el("tr", {}, el("td", { colspan: cols, class: "empty", text: emptyText })));
  }
}

function facts(id, pairs) {
  $(id).replaceChildren(...pairs.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]));
}

function render(doc) {
  const st = doc.status;
  $("node-id").textContent = `${st.node_id} on ${st.network}`;
  const offered = st.offered || {};
  const peerCores = Object.values(st.peer_capacity || {}).reduce((a, p) => a + (p.cores || 0), 0);
  facts("capacity", [
    ["offered", `${offered.cores ?? "?"} of ${st.capacity.cores} cores, ${fmtBytes(offered.memory_bytes ?? 0)}`],
    ["owner", offered.suspended ? "working: jobs paused" : `away or idle (${(offered.owner_cpu_cores ?? 0).toFixed(2)} cores in use)`],
    ["capacity state", offered.state ?? "starting"],
    ["only when idle", offered.only_when_idle ? "yes" : "no"],
    ["executing", `${(doc.jobs.executor.running || 0)} running, ${doc.executing.length} not ended`],
    ["peers", `${st.peer_count} linked, offering ${peerCores} cores`],
    ["uptime", fmtSpan(st.uptime_seconds)],
  ]);
  fill("executing", doc.executing.map((j) => el("tr", { "data-job": j.job_id, "data-state": j.state },
    el("td", { class: "id", text: short(j.job_id) }), el("td", { class: `state-${j.state}`, text: j.state }),
    el("td", { class: "id", text: short(j.submitter) }), el("td", { text: fmtTime(j.started) }),
    el("td", { text: j.args.join(" ") }))), "nothing is running here");
  fill("served", doc.served.map((s) => el("tr", { "data-submitter": s.submitter },
    el("td", { class: "id", text: short(s.submitter) }), el("td", { text: fmtInt(s.jobs) }),
    el("td", { class: "served-done", text: fmtInt(s.done) }), el("td", { text: fmtInt(s.fuel) }),
    el("td", { text: s.run_seconds.toFixed(1) }))), "no jobs served yet");
  facts("receipt-log", [["receipts", fmtInt(doc.receipt_log.size)], ["root", doc.receipt_log.root]]);
  fill("peers", doc.peers.map((p) => el("tr", { "data-peer": p.node_id },
    el("td", { class: "id", text: short(p.node_id) }), el("td", { text: p.state }), el("td", { text: p.address ?? "" }),
    el("td", { text: st.peer_capacity?.[p.node_id] ? `${st.peer_capacity[p.node_id].cores} cores` : "" }),
    el("td", { text: p.rtt_ms === null || p.rtt_ms === undefined ? "" : `${p.rtt_ms.toFixed(1)} ms` }))), "no peers");
  fill("batches", doc.batches.map((b) => el("tr", { id: `batch-${b.batch_id}`, "data-ended": b.ended, "data-total": b.total },
    el("td", { class: "id", text: b.batch_id }),
    el("td", {}, el("progress", { max: b.total, value: b.ended })),
    el("td", { class: "ended", text: `${b.ended} / ${b.total}` }),
    el("td", { text: Object.entries(b.states).map(([s, n]) => `${s} ${n}`).join(", ") }),
    el("td", { class: "eta", text: b.ended >= b.total ? "done" : b.eta_seconds === null ? "…" : fmtSpan(b.eta_seconds) }))),
  "no batches");
  fill("jobs", doc.submitted.map((j) => el("tr", { "data-job": j.job_id, "data-state": j.state },
    el("td", { class: "id", text: short(j.job_id) }), el("td", { class: `state-${j.state}`, text: j.state }),
    el("td", { class: "id", text: short(j.executor) }), el("td", { text: fmtInt(j.fuel_used) }),
    el("td", { text: j.args.join(" ") }),
    el("td", {}, ...(j.state === "done" ? [
      el("button", { class: "download", "data-file": "stdout", onclick: () => download(j.job_id, "stdout") }, "stdout"),
      " ",
      el("button", { class: "show-receipt", onclick: () => showReceipt(j.job_id) }, "receipt"),
    ] : [j.reason ?? ""])))), "no jobs submitted from this node");
  $("updated").textContent = `updated ${new Date(doc.now * 1000).toLocaleTimeString("en-GB")} · version ${doc.version}`;
}

async function download(jobId, name, output = false) {
  const path = output ? `outputs/${encodeURIComponent(name)}` : `files/${name}`;
  const response = await api(`/v1/jobs/${jobId}/${path}`);
  const blob = await response.blob();
  const url = URL.createObjectURL(blob);
  const a = el("a", { href: url, download: `${jobId.slice(0, 12)}-${name.replace(/[^A-Za-z0-9._-]/g, "_")}` });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

async function showReceipt(jobId) {
  const r = await (await api(`/v1/jobs/${jobId}/receipt`)).json();
  $("receipt-job").textContent = short(jobId);
  $("receipt-summary").textContent =
    `${r.outcome_text}; signature ${r.signature.valid ? "valid" : "INVALID"} (signed by ${r.signature.signer}); ` +
    (r.log_index === null ? "not in this node's log" : `entry ${r.log_index} of this node's receipt log`);
  const rows = [["receipt id", r.receipt_id], ["size", `${r.bytes} bytes`]];
  for (const [k, v] of Object.entries(r.fields)) rows.push([k, typeof v === "object" && v !== null ? JSON.stringify(v) : String(v)]);
  $("receipt-fields").tBodies[0].replaceChildren(...rows.map(([k, v]) =>
    el("tr", { "data-field": k }, el("th", { text: k }), el("td", { class: "mono", text: v }))));
  const files = ["stdout", "stderr", "receipt"].map((name) =>
    el("button", { class: "download", "data-file": name, onclick: () => download(jobId, name) }, name));
  const outputs = (r.fields.outputs || []).map((f) =>
    el("button", { class: "download", "data-output": f.name, onclick: () => download(jobId, f.name, true) }, `output/${f.name}`));
  $("receipt-downloads").replaceChildren("Download: ", ...files.flatMap((b) => [b, " "]), ...outputs.flatMap((b) => [b, " "]));
  $("receipt").hidden = false;
}

async function follow(mine) {
  let version = null;
  while (mine === following) {
    try {
      const query = version === null ? "" : `?after=${version}&timeout=20`;
      const doc = await (await api(`/v1/overview${query}`)).json();
      if (mine !== following) return;
      render(doc);
      version = doc.version;
      $("connection").textContent = "live";
      $("connection").className = "pill live";
    } catch (e) {
      if (mine !== following) return;
      if (e instanceof SignedOut) { signOut(e.message); return; }
      $("connection").textContent = `reconnecting: ${e.message}`;
      $("connection").className = "pill";
      await new Promise((ok) => setTimeout(ok, 2000));
    }
  }
}

function signIn(value) {
  token = value;
  sessionStorage.setItem(KEY, value);
  $("login").hidden = true;
  $("app").hidden = false;
  $("sign-out").hidden = false;
  following += 1;
  follow(following);
}

function signOut(why = "") {
  following += 1;
  token = null;
  sessionStorage.removeItem(KEY);
  $("app").hidden = true;
  $("sign-out").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = why;
  $("connection").textContent = "signed out";
  $("connection").className = "pill";
}

$("login-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const value = $("token").value.trim();
  $("token").value = "";
  if (value) signIn(value);
});
$("sign-out").addEventListener("click", () => signOut());
$("receipt-close").addEventListener("click", () => { $("receipt").hidden = true; });

// A link may carry the token in its fragment (#token=..., never sent to a server): take it, drop it from the URL.
function tokenFromHash() {
  const value = new URLSearchParams(location.hash.slice(1)).get("token");
  if (value) history.replaceState(null, "", location.pathname);
  return value;
}
window.addEventListener("hashchange", () => {
  const value = tokenFromHash();
  if (value) { signOut(); signIn(value); }
});
const saved = tokenFromHash() || sessionStorage.getItem(KEY);
if (saved) signIn(saved);
