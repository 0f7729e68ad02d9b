// hctx-channel.ts: the pi / omp extension hctx loads with `--extension` (pi via jiti, omp via bun).
//
// Two ways in. `hctx wrap` loads it with `--extension` and sets $HCTX_CHANNEL: the default export
// reports there. `hctx setup` places a small loader in the user's extension directory
// (sidecar/harnesses/pi/setup.py) that imports this file and calls `adopt`: in a session started
// without hctx ($HCTX_CHANNEL absent) it starts hctx's adopting wrapper for this process, detached,
// and reports to the socket that adoption's sidecar listens on, computed from this process's pid and
// start time exactly as sidecar/adoption.py computes it. In a wrapped seat `adopt` does nothing, so
// the file loaded twice (once by `--extension`, once through the loader) reports once.
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
import { spawn } from "node:child_process";
import { existsSync, readFileSync, realpathSync, statSync } from "node:fs";
import { createConnection } from "node:net";
import { basename, dirname, join } from "node:path";
import type { Socket } from "node:net";

const CHANNEL_ENV = "HCTX_CHANNEL";
// A sidecar that stops reading must not grow the harness's memory without bound.
const MAX_BUFFERED_BYTES = 1 << 20;
// A dead sidecar is retried at most this often, not on every event.
const RECONNECT_AFTER_MS = 1000;
// An adopted session's sidecar starts moments after the session does (the adopter's interpreter, its
// claim, the resident, the sidecar's bind: about a second measured). Until it listens, frames wait in
// the queue and the socket is retried on a timer that never holds the process, for at most this long.
const ADOPTION_PATIENCE_MS = 30_000;
const ADOPTION_RETRY_MS = 100;
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

interface HostPackage {
	name: string;
	version: string | null;
}

function hostPackage(): HostPackage | null {
	let dir = attempt(() => dirname(realpathSync(process.argv[1])));
	for (let depth = 0; dir && depth < 8; depth++) {
		const here = dir;
		const manifest: any = attempt(() => JSON.parse(readFileSync(join(here, "package.json"), "utf8")));
		if (manifest && HOST_PACKAGE.test(String(manifest.name))) {
			return { name: String(manifest.name), version: stringOrNull(manifest.version) };
		}
		const parent = dirname(here);
		if (parent === here) return null;
		dir = parent;
	}
	return null;
}

function hostVersion(): string | null {
	return hostPackage()?.version ?? null;
}

// Which harness this process is, for the adopter's --harness: omp's package is @oh-my-pi's (measured:
// omp 18.1.16 and 18.2.3 run dist/cli.js of @oh-my-pi/pi-coding-agent under bun; pi 0.84.2 and 1.6.0
// run @earendil-works/pi-coding-agent's under node). Without a package above the CLI (a compiled
// binary), omp is the one that runs on bun.
function hostHarness(): "pi" | "omp" {
	const name = hostPackage()?.name;
	if (name !== undefined) return name.startsWith("@oh-my-pi/") ? "omp" : "pi";
	return attempt(() => typeof (process as any).versions.bun === "string") === true ? "omp" : "pi";
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
	private retry: ReturnType<typeof setTimeout> | null = null;

	// `patientUntil`: until then a socket nobody listens on yet keeps the queue and is retried on a
	// timer (an adoption's sidecar is starting); after it, and for a wrapped seat, a failure drops the
	// queue and the next event retries at most every RECONNECT_AFTER_MS, as before.
	constructor(
		private readonly path: string,
		private readonly patientUntil: number = Number.NEGATIVE_INFINITY,
	) {}

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

	// Connect now (an adoption: the session_start frame is queued before the sidecar listens).
	start(): void {
		attempt(() => this.socket ?? this.open());
	}

	private drop(socket: Socket | null): void {
		if (socket === null) return;
		if (this.socket === socket) {
			const waiting = !this.connected && Date.now() < this.patientUntil;
			this.socket = null;
			this.connected = false;
			if (waiting) {
				this.later();
			} else {
				this.queue = [];
				this.queuedBytes = 0;
				this.failedAt = Date.now();
			}
		}
		attempt(() => socket.destroy());
	}

	private later(): void {
		if (this.retry !== null) return;
		const timer = setTimeout(() => {
			this.retry = null;
			attempt(() => this.socket ?? this.open());
		}, ADOPTION_RETRY_MS);
		// Waiting for the sidecar never keeps the harness alive.
		attempt(() => timer.unref());
		this.retry = timer;
	}
}

// One socket per channel path in a process, however many times the extension is bound in it: omp
// binds it anew to each `task` child's session (measured on 18.1.16 and 18.2.3), and frames on one
// socket arrive in the order they were sent. A child's last `running` frame on a socket of its own
// could land after the parent's `async-result` naming it finished (seen once in five adopted runs
// of omp 18.2.3), and its row would stay running.
const CHANNELS = Symbol.for("hctx.channels");

function channelFor(path: string, patientUntil?: number): Channel {
	const state: any = globalThis;
	const channels: Map<string, Channel> = state[CHANNELS] ?? (state[CHANNELS] = new Map());
	let channel = channels.get(path);
	if (channel === undefined) {
		channel = new Channel(path, patientUntil);
		channels.set(path, channel);
	}
	return channel;
}

export default function hctxChannel(pi: any): void {
	const path = attempt(() => process.env[CHANNEL_ENV]);
	if (!path) return; // not launched by `hctx wrap`: stay inert (the setup loader's `adopt` is the other way in)
	report(pi, channelFor(path));
}

// --- adoption (issue 36) -------------------------------------------------------------------------

// sidecar/adoption.py's `process_start_ticks`: /proc/<pid>/stat field 22, after the command's name
// (which may hold spaces and parentheses); null for a zombie or when it cannot be read.
export function processStartTicks(pid: number): number | null {
	const stat = attempt(() => readFileSync(`/proc/${pid}/stat`, "latin1"));
	if (stat === undefined) return null;
	const fields = stat.slice(stat.lastIndexOf(")") + 1).split(/\s+/).filter((field) => field !== "");
	if (fields.length < 20 || fields[0] === "Z" || fields[0] === "X") return null;
	return /^\d+$/.test(fields[19]) ? Number(fields[19]) : null;
}

// sidecar/adoption.py's `adoption_channel`:
// <$XDG_RUNTIME_DIR, else /tmp>/hctx-<uid>/adopt-<pid>-<start ticks>/channel.
export function adoptionChannel(pid: number, startTicks: number, env: Record<string, string | undefined>): string {
	let runtime = (env.XDG_RUNTIME_DIR ?? "").replace(/\/+$/, "");
	if (!runtime.startsWith("/") || attempt(() => statSync(runtime).isDirectory()) !== true) runtime = "/tmp";
	return `${runtime}/hctx-${process.getuid?.() ?? 0}/adopt-${pid}-${startTicks}/channel`;
}

// One adopter per process, however often the extension is loaded in it (omp binds extensions anew
// for each subagent session, pi on /reload): the adopter's own lock would refuse a second one, this
// spares starting it.
const ADOPTER_STARTED = Symbol.for("hctx.adopterStarted");
// Set in the environment of a process nothing adopts (as in sidecar/adoption.py).
export const ADOPT_ENV_GUARDS = [CHANNEL_ENV, "HCTX_NO_ADOPT"];

function startAdopter(command: string[], pid: number, cwd: string, host: string): void {
	const state: any = globalThis;
	if (state[ADOPTER_STARTED] === true) return;
	state[ADOPTER_STARTED] = true;
	const [program, ...args] = command;
	// pi's and omp's launch plan is one module: the hint tells its `adopted` which harness this is.
	const adoption = ["--pid", String(pid), "--cwd", cwd, "--hint", `harness=${host}`];
	const child = spawn(program, [...args, ...adoption], {
		detached: true,
		stdio: "ignore",
		env: process.env,
	});
	// A missing interpreter (hctx moved or removed) is an `error` event: swallowed, the session runs on.
	child.on("error", () => undefined);
	child.unref();
}

// What the loader `hctx setup` placed calls: `commands` maps each harness to its adopting command
// (`sidecar.setup_plan.adopt_command(harness)`, without --pid and --cwd, which this process adds).
export function adopt(pi: any, commands: Record<string, string[]>): void {
	// A wrapped seat (the `--extension` load reports) or one kept plain: sidecar/adoption.py's ADOPT_ENV_GUARDS.
	if (ADOPT_ENV_GUARDS.some((name) => attempt(() => process.env[name]))) return;
	const pid = process.pid;
	const start = processStartTicks(pid);
	const host = hostHarness();
	const command = attempt(() => commands[host]);
	if (start === null || !Array.isArray(command) || command.length === 0) return;
	const channel = channelFor(adoptionChannel(pid, start, process.env), Date.now() + ADOPTION_PATIENCE_MS);
	let started = false;
	attempt(() =>
		pi.on("session_start", (_payload: any, ctx: any) => {
			if (started) return undefined;
			started = true;
			const cwd = stringOrNull(attempt(() => ctx.cwd)) ?? process.cwd();
			attempt(() => startAdopter(command.map(String), pid, cwd, host));
			channel.start();
			return undefined;
		}),
	);
	report(pi, channel);
}

// The reporting both ways in share: every lifecycle event's frame on `channel`.
function report(pi: any, channel: Channel): void {
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
