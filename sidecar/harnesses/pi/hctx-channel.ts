// hctx-channel.ts: the pi / omp extension hctx loads with `--extension` (pi via jiti, omp via bun).
//
// It reports the harness's own context reading to the hctx sidecar: one newline-terminated JSON
// frame per lifecycle event on the unix stream socket named by $HCTX_CHANNEL,
//
//   {"type":"context","event":E,
//    "reading":{"tokens","contextWindow","percent","model","costUsd"} | null,
//    "compaction":null | {"reason","count"},
//    "compactions": <compaction entries in the session store> | null,
//    "version": <the host's own build, e.g. "1.6.0"> | null,
//    "compactionSettings": {"enabled", "reserveTokens"} | null,
//    "lastCompactionAt": <the newest compaction entry's timestamp in the session store> | null}
//
// omp's `task` subagents run in the same process with this extension rebound to each child's own
// session; a child's frames are never `context` frames but
//
//   {"type":"subagent","event":E,"id":<the child's session name>,"state":"running"|"finished",
//    "reading":{"tokens","contextWindow","percent","model","costUsd"} | null,
//    "compactions":<compaction entries in the child's session store> | null}
//
// each the child's own ctx.getContextUsage(), as the agent's own reading is; "finished" on the child's
// session_shutdown, and (reading null) when the parent is delivered omp's `async-result` naming the
// child's job as completed.
//
// `compactionSettings` is pi's own `compaction` settings as `pi.getSettings()` (pi >= 1.x) merges
// them, the current model's `modelOverrides` entry applied; a key the user never set is null (the
// harness's default applies, which the producer knows). It is null as a whole where the host has
// no getSettings (pi 0.84.2, omp).
//
// `reading` is ctx.getContextUsage() exactly as the harness answers it: unclamped, nulls kept (pi
// answers null tokens/percent right after a compaction, and that null is the measurement). It is null
// as a whole only when the harness gives no usage object at all. No imports from either harness, so
// one file loads in both; it must never break the harness, so every telemetry pull and every socket
// operation fails open, quietly.
import { existsSync, readFileSync, realpathSync } from "node:fs";
import { createConnection } from "node:net";
import { basename, dirname, join } from "node:path";
import type { Socket } from "node:net";

const CHANNEL_ENV = "HCTX_CHANNEL";
// A sidecar that stops reading must not grow the harness's memory without bound.
const MAX_BUFFERED_BYTES = 1 << 20;
// A dead sidecar is retried at most this often, not on every event.
const RECONNECT_AFTER_MS = 1000;
// pi: turn_end carries a settled usage, message_end the finest boundary (a tool loop is one long
// turn of many messages); agent_settled is pi's, session_stop omp's (where omp's numbers settle).
const READING_EVENTS = ["session_start", "message_end", "turn_end", "agent_end", "agent_settled", "session_stop"];

interface Reading {
	tokens: number | null;
	contextWindow: number | null;
	percent: number | null;
	model: string | null;
	costUsd: number | null;
}

interface Compaction {
	reason: string | null;
	count: number | null;
}

function attempt<T>(pull: () => T): T | undefined {
	try {
		return pull();
	} catch {
		return undefined;
	}
}

function numberOrNull(value: unknown): number | null {
	return typeof value === "number" && Number.isFinite(value) ? value : null;
}

function stringOrNull(value: unknown): string | null {
	return typeof value === "string" ? value : null;
}

// Neither extension API names the host's build. Both harnesses' own `VERSION` export is the
// `version` of their package.json, the first one above the running CLI whose name ends so.
const HOST_PACKAGE = /(^|\/)pi-coding-agent$/;

function hostVersion(): string | null {
	let dir = attempt(() => dirname(realpathSync(process.argv[1])));
	for (let depth = 0; dir && depth < 8; depth++) {
		const here = dir;
		const manifest: any = attempt(() => JSON.parse(readFileSync(join(here, "package.json"), "utf8")));
		if (manifest && HOST_PACKAGE.test(String(manifest.name))) return stringOrNull(manifest.version);
		const parent = dirname(here);
		if (parent === here) return null;
		dir = parent;
	}
	return null;
}

function booleanOrNull(value: unknown): boolean | null {
	return typeof value === "boolean" ? value : null;
}

interface CompactionSettings {
	enabled: boolean | null;
	reserveTokens: number | null;
}

// As pi's SettingsManager.getCompactionSettings(model) reads them, without its defaults.
function compactionSettings(pi: any, ctx: any): CompactionSettings | null {
	if (typeof attempt(() => pi.getSettings) !== "function") return null;
	const settings: any = attempt(() => pi.getSettings());
	if (settings === undefined || settings === null || typeof settings !== "object") return null;
	const compaction: any = attempt(() => settings.compaction) ?? {};
	const key = attempt(() => `${ctx.model.provider}/${ctx.model.id}`);
	const override = key === undefined ? undefined : attempt(() => compaction.modelOverrides[key].reserveTokens);
	return {
		enabled: booleanOrNull(attempt(() => compaction.enabled)),
		reserveTokens: numberOrNull(override ?? attempt(() => compaction.reserveTokens)),
	};
}

function entriesOf(ctx: any): unknown[] | null {
	const entries = attempt(() => ctx.sessionManager.getEntries());
	return Array.isArray(entries) ? entries : null;
}

// The harness-durable count: compaction entries in the session store, or null when it cannot be read.
function compactionCount(ctx: any): number | null {
	const entries = entriesOf(ctx);
	if (entries === null) return null;
	const count = attempt(() => entries.filter((entry: any) => entry?.type === "compaction").length);
	return count === undefined ? null : count;
}

// When the newest compaction in the session store happened (its entry's own timestamp), or null: a
// resumed or switched-to session restates its last compaction's time, not only its count.
function lastCompactionAt(ctx: any): string | null {
	const entries = entriesOf(ctx);
	if (entries === null) return null;
	const newest = attempt(() => entries.filter((entry: any) => entry?.type === "compaction").at(-1));
	return stringOrNull(attempt(() => newest.timestamp));
}

function assistantCost(message: any): number | null {
	if (attempt(() => message.role) !== "assistant") return null;
	return numberOrNull(attempt(() => message.usage.cost.total));
}

// The cost of the newest assistant message already in the session store (null for a fresh session).
function storedCost(ctx: any): number | null {
	const entries = entriesOf(ctx);
	if (entries === null) return null;
	for (let index = entries.length - 1; index >= 0; index--) {
		const entry: any = entries[index];
		if (attempt(() => entry.type === "message" && entry.message.role === "assistant")) {
			return assistantCost(entry.message);
		}
	}
	return null;
}

// omp rebinds every extension of the parent to each `task` subagent's own session, in the same
// process: without this the parent's record would carry a child's numbers (measured on omp 18.1.16
// and 18.2.3). A subagent's session file lies in the directory named after its parent's session
// file (`<parent>/<name>.jsonl`, the rule omp's own session manager walks up by), and its header
// names that parent; pi has no subagents and never nests its session files.
// Its name: the file's (`Child0.jsonl`), which is also omp's agent id and job id for it.
function subagentName(ctx: any): string | null {
	const file = stringOrNull(attempt(() => ctx.sessionManager.getSessionFile()));
	if (file === null) return null;
	const parentFile = `${dirname(file)}.jsonl`;
	const named = stringOrNull(attempt(() => ctx.sessionManager.getHeader().parentSession));
	if (named !== parentFile && attempt(() => existsSync(parentFile)) !== true) return null;
	return bounded(basename(file).replace(/\.jsonl$/, ""));
}

// The record's bound on a subagent id (guard.record.Printable).
const MAX_ID_CHARS = 128;

function bounded(value: string): string {
	return value.slice(0, MAX_ID_CHARS);
}

// The jobs an omp `async-result` delivery names as done (the parent's custom message).
function finishedJobs(message: any): string[] {
	if (attempt(() => message.role === "custom" && message.customType === "async-result") !== true) return [];
	const jobs: any = attempt(() => message.details.jobs);
	if (!Array.isArray(jobs)) return [];
	const ids = jobs.slice(0, 64).map((job: any) => stringOrNull(attempt(() => job.jobId)));
	return ids.filter((id): id is string => id !== null).map(bounded);
}

class Channel {
	private socket: Socket | null = null;
	private connected = false;
	private queue: string[] = [];
	private queuedBytes = 0;
	private failedAt = Number.NEGATIVE_INFINITY;

	constructor(private readonly path: string) {}

	send(line: string): void {
		try {
			const socket = this.socket ?? this.open();
			if (socket === null) return;
			if (!this.connected) {
				if (this.queuedBytes + line.length <= MAX_BUFFERED_BYTES) {
					this.queue.push(line);
					this.queuedBytes += line.length;
				}
				return;
			}
			if (socket.writableLength <= MAX_BUFFERED_BYTES) socket.write(line);
		} catch {
			this.drop(this.socket);
		}
	}

	private open(): Socket | null {
		if (Date.now() - this.failedAt < RECONNECT_AFTER_MS) return null;
		const socket = createConnection(this.path);
		this.socket = socket;
		this.connected = false;
		// The channel never keeps the harness alive; it lives exactly as long as the harness does.
		attempt(() => socket.unref());
		socket.on("error", () => this.drop(socket));
		socket.on("close", () => this.drop(socket));
		socket.on("data", () => undefined);
		socket.on("connect", () => {
			if (this.socket !== socket) return;
			this.connected = true;
			const queued = this.queue;
			this.queue = [];
			this.queuedBytes = 0;
			for (const line of queued) this.send(line);
		});
		return socket;
	}

	private drop(socket: Socket | null): void {
		if (socket === null) return;
		if (this.socket === socket) {
			this.socket = null;
			this.connected = false;
			this.queue = [];
			this.queuedBytes = 0;
			this.failedAt = Date.now();
		}
		attempt(() => socket.destroy());
	}
}

export default function hctxChannel(pi: any): void {
	const path = attempt(() => process.env[CHANNEL_ENV]);
	if (!path) return; // not launched by `hctx wrap`: stay inert
	const channel = new Channel(path);
	// The last assistant message's cost, restated on every frame: a frame without it would erase the
	// published cost at the next event that carries no message.
	let costUsd: number | null = null;
	// omp names its auto-compaction's reason only on auto_compaction_start, never on session_compact.
	let pendingReason: string | null = null;
	const version = hostVersion();

	function reading(ctx: any): Reading | null {
		const usage: any = attempt(() => ctx.getContextUsage());
		if (usage === null || typeof usage !== "object") return null;
		return {
			tokens: numberOrNull(attempt(() => usage.tokens)),
			contextWindow: numberOrNull(attempt(() => usage.contextWindow)),
			percent: numberOrNull(attempt(() => usage.percent)),
			model: stringOrNull(attempt(() => ctx.model.id)),
			costUsd,
		};
	}

	function send(frame: object): void {
		channel.send(`${JSON.stringify(frame)}\n`);
	}

	// A subagent's numbers are its own, never the agent's: its frames are never `context` frames.
	function emitSubagent(event: string, id: string, ctx: any, state: string): void {
		send({ type: "subagent", event, id, state, reading: reading(ctx), compactions: compactionCount(ctx) });
	}

	function emit(event: string, ctx: any, compaction: Compaction | null, count: number | null): void {
		const child = subagentName(ctx);
		if (child !== null) {
			emitSubagent(event, child, ctx, "running");
			return;
		}
		const now = reading(ctx);
		if (now === null && compaction === null) return;
		const settings = compactionSettings(pi, ctx);
		const frame = {
			type: "context", event, reading: now, compaction, compactions: count, version, compactionSettings: settings,
			lastCompactionAt: lastCompactionAt(ctx),
		};
		send(frame);
	}

	function on(event: string, handler: (payload: any, ctx: any) => void): void {
		attempt(() =>
			pi.on(event, (payload: any, ctx: any) => {
				attempt(() => handler(payload, ctx));
				return undefined;
			}),
		);
	}

	for (const event of READING_EVENTS) {
		on(event, (payload, ctx) => {
			if (event === "session_start") {
				// A new or resumed session restates its own last cost, never its predecessor's.
				costUsd = storedCost(ctx);
			} else if (event === "message_end") {
				const message = attempt(() => payload.message);
				const cost = assistantCost(message);
				if (cost !== null) costUsd = cost;
				if (subagentName(ctx) === null) {
					for (const id of finishedJobs(message)) {
						send({ type: "subagent", event: "async-result", id, state: "finished", reading: null, compactions: null });
					}
				}
			}
			emit(event, ctx, null, compactionCount(ctx));
		});
	}
	on("session_shutdown", (_payload, ctx) => {
		const child = subagentName(ctx);
		if (child !== null) emitSubagent("session_shutdown", child, ctx, "finished");
	});
	on("auto_compaction_start", (payload) => {
		pendingReason = stringOrNull(attempt(() => payload.reason));
	});
	on("auto_compaction_end", () => {
		pendingReason = null;
	});
	on("session_compact", (payload, ctx) => {
		const reason = stringOrNull(attempt(() => payload.reason)) ?? pendingReason;
		pendingReason = null;
		// Read inside the handler, the store already holds this compaction's entry.
		const count = compactionCount(ctx);
		emit("session_compact", ctx, { reason, count }, count);
	});
}
