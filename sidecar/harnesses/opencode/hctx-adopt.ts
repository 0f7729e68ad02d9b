// hctx-adopt.ts: the OpenCode plugin `hctx setup` places in the user's plugin directory (issue 36).
//
// A session started without `hctx wrap` (the TUI, `opencode run`, `opencode serve`) gets its own
// sidecar: the plugin starts hctx's adopting wrapper, detached, and hands it the address of a
// loopback event stream that carries what the server's own `GET /event` carries.
//
// Why a stream of the plugin's own (measured on 1.18.25 and 1.18.33): a plain TUI and `opencode run`
// listen on no port at all (their server answers in process), and the plugin input's `serverUrl`
// is then the constant fallback http://localhost:4096/ where nothing listens. The plugin's `event`
// hook receives every bus event of its directory as `{id, type, properties}`, the very filter and
// mapping the server's `/event` route applies, so the bridge serves them as that route does:
//
//   GET /<token>/event             text/event-stream: `server.connected`, then the events,
//                                  `server.heartbeat` every 10 s
//   GET /<token>/config/providers  each provider's models' `limit`, through the plugin's own `client`
//   GET /<token>/config            the config's `compaction`, likewise
//
// The two answers carry only what the sidecar reads of them (sidecar.harnesses.opencode.producer:
// the windows and the compaction point), never a provider's `options`, which hold API keys.
//
// Measured against `opencode serve`'s own `/event` beside it (1.18.33, two turns and both
// compactions, three runs): the same 145 events, same ids, same order. 5 to 7 differed in content,
// the bridge's copy the truer one: it is serialized when the event is published, while the route
// serializes when it writes, by which time the same message object may already have been updated
// (e.g. `time.completed` on the first of the two completion frames, or a whole completion in a
// summary's creation frame).
//
// The bridge listens on 127.0.0.1 and a port the kernel picks, under a random path token, and
// answers only a peer of this user: the client's end of the connection in /proc/net/tcp{,6} must
// carry this process's uid. The token alone would not do: it travels in the adopter's and the
// sidecar's command lines, which other local users can read. The sidecar's OpenCode transport follows it
// unchanged. Events that arrive while no stream is open (before the sidecar connects, or while it
// reconnects) are kept, bounded, and sent to the next stream, so the first turn of a short
// `opencode run` is not lost; the instance's `dispose` (at the harness's exit) waits for them and for the config pulls
// the sidecar makes on connecting, at most DRAIN_MS and only while the adopter has not failed: the
// one wait the plugin ever makes, so that a session shorter than the adopter's start still has its
// whole record.
//
// It adopts only when HCTX_CHANNEL is absent (a wrapped seat has its own sidecar: the wrapped seat
// wins) and HCTX_NO_ADOPT is not set, and once per process (`opencode serve` loads plugins once per directory it serves; the
// first directory is followed). It must never break or hold up the harness: every step fails open,
// quietly, and nothing of it keeps the process alive.
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";

// `hctx setup` writes the adopting command here (sidecar.setup_plan.adopt_command); empty: inert.
const ADOPT_COMMAND: string[] = []; // hctx: adopt command
// A wrapped seat's harness has HCTX_CHANNEL; HCTX_NO_ADOPT=1 keeps a session plain
// (sidecar.adoption.ADOPT_ENV_GUARDS, which tests/test_opencode_setup.py holds this to).
const ENV_GUARDS: string[] = ["HCTX_CHANNEL", "HCTX_NO_ADOPT"];
const LOOPBACK = "127.0.0.1";
const HEARTBEAT_MS = 10_000;
// Events kept while no stream is open: the oldest go first beyond this.
const MAX_KEPT_BYTES = 16 << 20;
// A stream whose reader stops reading is closed beyond this much queued (the sidecar reconnects).
const MAX_QUEUED_BYTES = 16 << 20;
// The most the instance's dispose (the harness's exit) waits for the sidecar to have the session.
const DRAIN_MS = 3_000;

const encoder = new TextEncoder();

interface BusEvent {
	id?: string;
	type: string;
	properties?: unknown;
}

interface Stream {
	controller: ReadableStreamDefaultController<Uint8Array>;
	heartbeat: ReturnType<typeof setInterval>;
}

function frame(event: BusEvent): Uint8Array {
	return encoder.encode(`data: ${JSON.stringify(event)}\n\n`);
}

function eventId(): string {
	return `evt_hctx${randomBytes(12).toString("hex")}`;
}

class Bridge {
	private kept: Uint8Array[] = [];
	private keptBytes = 0;
	private pulling = 0; // config answers being made
	private configServed = false; // the sidecar pulls /config right after it opens a stream
	private everOpened = false;
	private streams = new Set<Stream>();
	private server: { port: number; stop(closeActive?: boolean): void; unref?(): void } | null = null;
	readonly token = randomBytes(18).toString("hex");

	constructor(private readonly client: any) {}

	url(): string | null {
		return this.server ? `http://${LOOPBACK}:${this.server.port}/${this.token}` : null;
	}

	start(): void {
		const bun = (globalThis as any).Bun;
		if (!bun?.serve) return;
		this.server = bun.serve({
			hostname: LOOPBACK,
			port: 0,
			idleTimeout: 0, // an event stream is idle between heartbeats by design
			fetch: (request: Request, server: any) => this.answer(request, server),
		});
		this.server?.unref?.();
	}

	publish(event: BusEvent): void {
		const bytes = frame(event);
		if (this.streams.size === 0) {
			this.kept.push(bytes);
			this.keptBytes += bytes.length;
			while (this.keptBytes > MAX_KEPT_BYTES && this.kept.length > 0) {
				this.keptBytes -= this.kept.shift()!.length;
			}
			return;
		}
		for (const stream of this.streams) this.send(stream, bytes);
	}

	// Resolves once the sidecar has what it needs of this session (nothing kept, no answer being
	// made, the config it pulls on connecting served), after `ms`, or once `hope` says no sidecar
	// will come.
	async drained(ms: number, hope: () => boolean): Promise<void> {
		const until = Date.now() + ms;
		const settled = () => this.kept.length === 0 && this.pulling === 0 && this.configServed;
		// A sidecar that was connected and is gone now (it died, or it is backing off) is not waited for.
		const lost = () => this.everOpened && this.streams.size === 0;
		while (!settled() && !lost() && Date.now() < until && hope()) await new Promise((done) => setTimeout(done, 50));
	}

	stop(): void {
		for (const stream of [...this.streams]) this.close(stream);
		try {
			this.server?.stop(true);
		} catch {}
		this.server = null;
	}

	private send(stream: Stream, bytes: Uint8Array): void {
		try {
			if ((stream.controller.desiredSize ?? 0) < -MAX_QUEUED_BYTES) {
				this.close(stream);
				return;
			}
			stream.controller.enqueue(bytes);
		} catch {
			this.close(stream);
		}
	}

	private close(stream: Stream): void {
		clearInterval(stream.heartbeat);
		this.streams.delete(stream);
		try {
			stream.controller.close();
		} catch {}
	}

	private async answer(request: Request, server: any): Promise<Response> {
		const peer = server?.requestIP?.(request);
		if (!peer || !this.server || !peerIsThisUser(peer.port, this.server.port)) {
			return new Response("forbidden", { status: 403 });
		}
		const path = new URL(request.url).pathname;
		const prefix = `/${this.token}/`;
		if (request.method !== "GET" || !path.startsWith(prefix)) return new Response("not found", { status: 404 });
		const route = path.slice(prefix.length);
		if (route === "event") {
			server?.timeout?.(request, 0);
			return this.eventStream();
		}
		if (route === "config/providers") return this.pull(() => this.client.config.providers(), providersView);
		if (route === "config") {
			const answer = await this.pull(() => this.client.config.get(), configView);
			this.configServed ||= answer.ok;
			return answer;
		}
		return new Response("not found", { status: 404 });
	}

	private eventStream(): Response {
		let opened: Stream | null = null;
		const body = new ReadableStream<Uint8Array>(
			{
				start: (controller) => {
					const stream: Stream = {
						controller,
						heartbeat: setInterval(
							() => this.send(stream, frame({ id: eventId(), type: "server.heartbeat", properties: {} })),
							HEARTBEAT_MS,
						),
					};
					(stream.heartbeat as any).unref?.();
					opened = stream;
					controller.enqueue(frame({ id: eventId(), type: "server.connected", properties: {} }));
					for (const bytes of this.kept) controller.enqueue(bytes);
					this.kept = [];
					this.keptBytes = 0;
					this.streams.add(stream);
					this.everOpened = true;
				},
				cancel: () => {
					if (opened) this.close(opened);
				},
			},
			new ByteLengthQueuingStrategy({ highWaterMark: 1 << 16 }),
		);
		return new Response(body, {
			headers: { "content-type": "text/event-stream", "cache-control": "no-cache, no-transform" },
		});
	}

	private async pull(call: () => Promise<any>, view: (data: any) => unknown): Promise<Response> {
		this.pulling += 1;
		try {
			const answer = await call();
			if (answer?.error !== undefined || answer?.data === undefined) return new Response("unavailable", { status: 502 });
			return new Response(JSON.stringify(view(answer.data)), { headers: { "content-type": "application/json" } });
		} catch {
			return new Response("unavailable", { status: 502 });
		} finally {
			this.pulling -= 1;
		}
	}
}

// `GET /config/providers` as the sidecar reads it: each provider's id and its models' ids and limits.
function providersView(data: any): unknown {
	const providers = Array.isArray(data?.providers) ? data.providers : [];
	return {
		providers: providers.map((provider: any) => ({
			id: provider?.id,
			models: Object.fromEntries(
				Object.entries(provider?.models ?? {}).map(([key, model]: [string, any]) => [
					key,
					{ id: model?.id, providerID: model?.providerID, limit: model?.limit },
				]),
			),
		})),
	};
}

// `GET /config` as the sidecar reads it: the compaction settings.
function configView(data: any): unknown {
	return data?.compaction === undefined ? {} : { compaction: data.compaction };
}

// Whether the loopback connection from `clientPort` to `serverPort` was opened by this user: the
// client's socket is the table row whose local port is `clientPort` and remote port `serverPort`,
// and its uid column (the 8th) is its owner's.
function peerIsThisUser(clientPort: number, serverPort: number): boolean {
	const uid = process.getuid?.();
	if (uid === undefined) return false;
	for (const table of ["/proc/net/tcp", "/proc/net/tcp6"]) {
		let text: string;
		try {
			text = readFileSync(table, "utf8");
		} catch {
			continue;
		}
		for (const line of text.split("\n").slice(1)) {
			const fields = line.trim().split(/\s+/);
			if (fields.length < 8) continue;
			const local = Number.parseInt(fields[1].split(":")[1] ?? "", 16);
			const remote = Number.parseInt(fields[2].split(":")[1] ?? "", 16);
			if (local === clientPort && remote === serverPort) return Number(fields[7]) === uid;
		}
	}
	return false;
}

let adopted = false; // once per process

// The adopter as it goes: "running" until it exits; it detaches its resident and exits 0.
let adopter: "running" | "ok" | "failed" = "failed";

function adopt(url: string, directory: string): void {
	const [program, ...args] = ADOPT_COMMAND;
	if (!program) return;
	const argv = [...args, "--pid", String(process.pid), "--hint", `url=${url}`, "--hint", `directory=${directory}`];
	let child;
	try {
		child = spawn(program, argv, { detached: true, stdio: "ignore" });
	} catch {
		return;
	}
	adopter = "running";
	// A missing interpreter or a refusal must not surface in the harness: it only ends the wait.
	child.on("error", () => (adopter = "failed"));
	child.on("exit", (code) => (adopter = code === 0 ? "ok" : "failed"));
	child.unref();
}

export const HctxAdopt = async (input: { client: any; directory: string }) => {
	if (adopted || ENV_GUARDS.some((name) => process.env[name]) || ADOPT_COMMAND.length === 0) return {};
	adopted = true;
	try {
		const bridge = new Bridge(input.client);
		bridge.start();
		const url = bridge.url();
		if (url) adopt(url, input.directory);
		if (!url || adopter === "failed") {
			bridge.stop();
			return {};
		}
		return {
			event: async ({ event }: { event: BusEvent }) => {
				try {
					bridge.publish(event);
				} catch {}
			},
			dispose: async () => {
				try {
					await bridge.drained(DRAIN_MS, () => adopter !== "failed");
				} catch {}
			},
		};
	} catch {
		return {};
	}
};
