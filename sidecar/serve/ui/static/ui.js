// The live page: polls ui/state.json once a second and redraws what changed. Every text
// goes in through textContent, never as markup: paths and route names come from outside.
"use strict";

(() => {
  const POLL_MS = 1000;
  const routesBox = document.getElementById("routes");
  const callsTable = document.getElementById("calls");
  const callsBody = callsTable.querySelector("tbody");
  const noCalls = document.getElementById("no-calls");
  const status = document.getElementById("status");
  const rows = new Map(); // a call's number -> its row

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined) node.textContent = String(text);
    return node;
  }

  function seconds(value) {
    return `${value.toFixed(1)} s`;
  }

  function fact(list, term, value, className) {
    list.append(el("dt", "", term), el("dd", className || "", value));
  }

  // Every circuit is listed while they are few; past that, those not closed are, and the
  // closed ones are counted.
  const LISTED_CIRCUITS = 6;

  function circuitText(circuit) {
    const where = circuit.tool ? `${circuit.tool}: ` : "";
    const probe = circuit.state === "open" ? `, probe in ${seconds(circuit.probe_in_s)}` : "";
    return `${where}${circuit.state}${probe}`;
  }

  function circuitLines(circuits) {
    if (!circuits.length) return [el("li", "note", "no call yet")];
    const line = (circuit) => el("li", `state ${circuit.state}`, circuitText(circuit));
    if (circuits.length <= LISTED_CIRCUITS) return circuits.map(line);
    const closed = circuits.filter((circuit) => circuit.state === "closed");
    const lines = circuits.filter((circuit) => circuit.state !== "closed").map(line);
    if (closed.length) lines.push(el("li", "state closed", `${closed.length} tools closed`));
    return lines;
  }

  function cooldownText(cooldown) {
    const path = cooldown.path !== cooldown.tool ? cooldown.path : "";
    const where = [cooldown.tool, path].filter(Boolean).join(" ") || "whole route";
    return `${where} ${seconds(cooldown.left_s)}`;
  }

  function routeCard(route) {
    const card = el("article", "route-card");
    card.dataset.route = route.name;
    card.append(el("h3", "route-name", route.name));
    const counts = el("dl", "counts");
    fact(counts, "calls/s", route.calls_per_s.toFixed(2));
    fact(counts, "ok", route.ok, "ok");
    fact(counts, "recovered", route.recovered, "recovered");
    fact(counts, "answered (4xx)", route.answered, "answered");
    fact(counts, "gave up", route.gave_up, "gave-up");
    card.append(counts);
    if (route.budget_left === null) {
      card.append(el("p", "note", "calls that matched no route"));
      return card;
    }
    const guards = el("div", "guards");
    const circuits = el("ul", "circuits");
    circuits.append(...circuitLines(route.circuits));
    const facts = el("dl");
    const cooldowns = route.cooldowns.map(cooldownText);
    fact(facts, "cooldowns", cooldowns.length ? cooldowns.join(", ") : "none");
    fact(facts, "retry budget left", route.budget_left);
    guards.append(el("p", "label", "circuits"), circuits, facts);
    card.append(guards);
    return card;
  }

  function cell(row, label, content, className) {
    const td = el("td", className || "");
    td.dataset.label = label;
    if (content instanceof Node) td.append(content);
    else td.textContent = String(content);
    row.append(td);
    return td;
  }

  function clockTime(epochSeconds) {
    const when = new Date(epochSeconds * 1000);
    const pad = (n, width = 2) => String(n).padStart(width, "0");
    return `${pad(when.getHours())}:${pad(when.getMinutes())}:${pad(when.getSeconds())}.` +
      pad(when.getMilliseconds(), 3);
  }

  function callRow(call) {
    const row = el("tr", `call ${call.answered ? "answered" : call.outcome}`);
    row.dataset.number = call.number;
    cell(row, "time", clockTime(call.finished_at), "time");
    cell(row, "route", call.route, "route");
    cell(row, "call", `${call.method} ${call.path}`, "target");
    // The tool's own 4xx, relayed untouched: its answer, not a call the sidecar gave up on.
    const outcome = call.answered ? "answered" : call.outcome;
    cell(row, "outcome", call.status ? `${outcome} (${call.status})` : outcome,
      `outcome ${outcome}`);
    cell(row, "attempts", call.attempts, "number");
    cell(row, "duration", `${call.duration_ms.toFixed(1)} ms`, "number");
    const trail = el("span", "trail");
    for (const token of call.trail) trail.append(el("span", "token", token));
    cell(row, "trail", trail);
    const repairs = call.repairs.map((r) => `${r.layer}: ${r.fields.join(", ")}`);
    cell(row, "repaired", repairs.length ? repairs.join("; ") : "—", "repairs");
    return row;
  }

  function drawCalls(calls) {
    const kept = new Set(calls.map((call) => call.number));
    for (const [number, row] of rows) {
      if (!kept.has(number)) {
        row.remove();
        rows.delete(number);
      }
    }
    // Newest first: what is new goes above every row already shown, in the order given.
    const first = callsBody.firstChild;
    for (const call of calls) {
      if (rows.has(call.number)) continue;
      const row = callRow(call);
      callsBody.insertBefore(row, first);
      rows.set(call.number, row);
    }
    callsTable.hidden = calls.length === 0;
    noCalls.hidden = calls.length !== 0;
  }

  function draw(state) {
    routesBox.replaceChildren(...state.routes.map(routeCard));
    drawCalls(state.calls);
  }

  async function poll() {
    try {
      const answer = await fetch("ui/state.json", { cache: "no-store" });
      if (!answer.ok) throw new Error(`the sidecar answered ${answer.status}`);
      draw(await answer.json());
      status.textContent = `updated ${clockTime(Date.now() / 1000)}, every ${POLL_MS / 1000} s`;
      status.classList.remove("down");
    } catch (error) {
      status.textContent = `not updated: ${error.message}; trying again`;
      status.classList.add("down");
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }

  poll();
})();
