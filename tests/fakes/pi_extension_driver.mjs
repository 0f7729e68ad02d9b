// Drives the shipped pi/omp extension asset outside the harness, for the runtime smoke test.
//
//   node pi_extension_driver.mjs ASSET CONTEXT SCRIPT JITI   (pi's loader: jiti from the pi package)
//   bun  pi_extension_driver.mjs ASSET CONTEXT SCRIPT        (omp's loader: bun's own TypeScript import)
//
// CONTEXT is "bare" (no telemetry surface at all), "populated" (the shapes the lab captured from
// SCRIPT's harness at window 32000: a plain object for pi, prototype getters for omp), or "throwing"
// (every telemetry pull throws). SCRIPT ("pi" or "omp") is that harness's event order and payloads.
// Every handler the asset registers is driven; the asset sends its frames to
// $HCTX_CHANNEL. Prints {"registered": [...], "threw": [...]} and exits once the frames had time to go
// (or, with $HCTX_DRIVER_LINGER_UNTIL, once that file exists).
// ASSET may also be the loader `hctx setup` places (sidecar/harnesses/pi/setup.py): its factory is
// async and reaches the asset's `adopt`, which reports to the adoption's channel instead.

import { existsSync } from "node:fs";

const [assetPath, contextKind, scriptName, jitiPath] = process.argv.slice(2);

async function loadFactory() {
	if (jitiPath) {
		const { createJiti } = await import(jitiPath);
		const jiti = createJiti(import.meta.url, { moduleCache: false });
		return await jiti.import(assetPath, { default: true });
	}
	const module = await import(assetPath);
	return module.default;
}

function assistant(usage) {
	return { role: "assistant", usage: { ...usage, cost: { total: usage.costTotal } } };
}

// One served turn, lab §5 at window 32000: prompt 16000 (12000 input + 4000 cacheRead), output 480.
// pi's tokens is the totalTokens 16480 (51.5 %); omp's the prompt-only 16000 (50 %).
const TURN = assistant({ input: 12000, output: 480, cacheRead: 4000, cacheWrite: 0, totalTokens: 16480, costTotal: 13.36 });
const OVERRUN = assistant({ input: 31200, output: 2400, cacheRead: 0, cacheWrite: 0, totalTokens: 33600, costTotal: 36 });

const SCRIPT = {
	pi: [
		["session_start", { reason: "startup" }, { tokens: 0, contextWindow: 32000, percent: 0 }],
		["message_end", { message: { role: "user" } }, { tokens: 306, contextWindow: 32000, percent: 0.95625 }],
		["message_end", { message: TURN }, { tokens: 16480, contextWindow: 32000, percent: 51.5 }],
		["turn_end", { message: TURN }, { tokens: 16480, contextWindow: 32000, percent: 51.5 }],
		["agent_end", {}, { tokens: 16480, contextWindow: 32000, percent: 51.5 }],
		["agent_settled", {}, { tokens: 16480, contextWindow: 32000, percent: 51.5 }],
		["session_compact", { reason: "manual", willRetry: false, fromExtension: false }, { tokens: null, contextWindow: 32000, percent: null }, "compact"],
		["message_end", { message: OVERRUN }, { tokens: null, contextWindow: 32000, percent: null }],
		["turn_end", { message: OVERRUN }, { tokens: 33600, contextWindow: 32000, percent: 105 }],
		["agent_end", {}, { tokens: 33600, contextWindow: 32000, percent: 105 }],
		["session_start", { reason: "new" }, { tokens: 0, contextWindow: 32000, percent: 0 }, "new"],
	],
	omp: [
		["session_start", {}, { tokens: 14952, contextWindow: 32000, percent: 46.725 }],
		["message_end", { message: { role: "user" } }, { tokens: 9919, contextWindow: 32000, percent: 30.996875 }],
		["message_end", { message: TURN }, { tokens: 9919, contextWindow: 32000, percent: 30.996875 }],
		["turn_end", { message: TURN }, { tokens: 9919, contextWindow: 32000, percent: 30.996875 }],
		["session_stop", { turn_id: "t", session_id: "s", stop_hook_active: false }, { tokens: 16000, contextWindow: 32000, percent: 50 }],
		["agent_end", {}, { tokens: 16000, contextWindow: 32000, percent: 50 }],
		["auto_compaction_start", { reason: "threshold", action: "handoff" }, { tokens: 16000, contextWindow: 32000, percent: 50 }],
		["session_compact", { fromExtension: false }, { tokens: 15013, contextWindow: 32000, percent: 46.915625 }, "compact"],
		["auto_compaction_end", { action: "handoff", aborted: false, willRetry: false }, { tokens: 15013, contextWindow: 32000, percent: 46.915625 }],
		["message_end", { message: OVERRUN }, { tokens: 15600, contextWindow: 32000, percent: 48.75 }],
		["session_stop", {}, { tokens: 36000, contextWindow: 32000, percent: 112.5 }],
		["agent_end", {}, { tokens: 36000, contextWindow: 32000, percent: 112.5 }],
		["session_start", {}, { tokens: 14952, contextWindow: 32000, percent: 46.725 }, "new"],
	],
};

class SessionStore {
	constructor() {
		this.entries = [{ type: "model_change" }, { type: "thinking_level_change" }];
	}
	getEntries() {
		return this.entries;
	}
}

// pi hands a plain object; omp a class whose telemetry are prototype getters (Object.keys is ["ui"]).
function populatedContext(kind, store, usageRef) {
	const model = { id: "fake-32k", provider: "fake", contextWindow: 32000 };
	if (kind === "pi") {
		return { ui: {}, model, sessionManager: store, getContextUsage: () => usageRef.current, isIdle: () => true };
	}
	class OmpContext {
		constructor() {
			this.ui = {};
		}
		get model() {
			return model;
		}
		get sessionManager() {
			return store;
		}
		getContextUsage() {
			return usageRef.current;
		}
	}
	return new OmpContext();
}

function throwingContext() {
	const fail = () => {
		throw new Error("telemetry unavailable");
	};
	return new Proxy({}, { get: fail, has: fail, ownKeys: fail, getOwnPropertyDescriptor: fail });
}

async function main() {
	const handlers = new Map();
	const pi = {
		on(name, handler) {
			if (!handlers.has(name)) handlers.set(name, []);
			handlers.get(name).push(handler);
		},
	};
	const factory = await loadFactory();
	// pi and omp await a factory (the setup loader's is async)
	await factory(pi);
	const threw = [];
	const store = new SessionStore();
	const usageRef = { current: undefined };
	const script = SCRIPT[scriptName];
	const driven = new Set();
	const ctxFor = () => {
		if (contextKind === "bare") return { ui: {} };
		if (contextKind === "throwing") return throwingContext();
		return populatedContext(scriptName, store, usageRef);
	};
	const fire = async (name, payload) => {
		for (const handler of handlers.get(name) ?? []) {
			try {
				await handler(payload, ctxFor());
			} catch (error) {
				threw.push(`${name}: ${error}`);
			}
		}
		driven.add(name);
	};
	for (const [name, payload, usage, storeChange] of script) {
		usageRef.current = usage;
		if (storeChange === "compact") store.entries.push({ type: "compaction", summary: `summary ${store.entries.length}` });
		// a replaced session (/new): a fresh store, no assistant message, no compaction in it
		if (storeChange === "new") store.entries = [{ type: "model_change" }];
		if (name === "message_end" && payload.message.role === "assistant") store.entries.push({ type: "message", message: payload.message });
		await fire(name, payload);
	}
	// Every handler runs, including ones this script's harness never fires.
	for (const name of handlers.keys()) if (!driven.has(name)) await fire(name, {});
	console.log(JSON.stringify({ registered: [...handlers.keys()].sort(), threw }));
	// An adopted run lingers while the test's stand-in sidecar comes up: until the test creates the
	// file $HCTX_DRIVER_LINGER_UNTIL (60 s at most: a liveness bound, whatever the machine's load).
	const until = process.env.HCTX_DRIVER_LINGER_UNTIL;
	if (!until) {
		setTimeout(() => process.exit(0), 400);
		return;
	}
	const deadline = Date.now() + 60_000;
	const linger = () => (existsSync(until) || Date.now() > deadline ? process.exit(0) : setTimeout(linger, 20));
	linger();
}

main().catch((error) => {
	console.log(JSON.stringify({ fatal: String(error?.stack ?? error) }));
	process.exit(3);
});
