// Drives hctx's OpenCode plugin (a filled copy of hctx-adopt.ts) as OpenCode does, on OpenCode's
// own embedded Bun (`BUN_BE_BUN=1 opencode driver.mjs PLUGIN DIRECTORY`), for
// tests/test_opencode_plugin_smoke.py.
//
// It calls the plugin with a client whose config/providers answer canned data, writes one JSON
// line per step to stdout ({"hooks": [...]} first), publishes three events at once (before any
// stream can be open) and then a `tick` event every 100 ms until its stdin ends, then runs the
// `dispose` hook and writes {"disposed_ms": N}.
const [plugin, directory] = process.argv.slice(2);
const { HctxAdopt } = await import(plugin);
const client = {
	config: {
		providers: async () => ({
			data: {
				providers: [
					{
						id: "fake",
						name: "Fake",
						options: { apiKey: "sk-secret-provider" },
						models: {
							"fake-model": {
								id: "fake-model",
								providerID: "fake",
								limit: { context: 128000, output: 8192 },
								options: { apiKey: "sk-secret-model" },
								headers: { authorization: "Bearer sk-secret-header" },
							},
						},
					},
				],
				default: { fake: "fake-model" },
			},
		}),
		get: async () => ({
			data: {
				$schema: "https://opencode.ai/config.json",
				compaction: { auto: true, reserved: 1000 },
				provider: { fake: { options: { apiKey: "sk-secret-config" } } },
			},
		}),
	},
};
const hooks = await HctxAdopt({ client, directory, project: { id: "global" }, worktree: "/" });
const say = (line) => process.stdout.write(JSON.stringify(line) + "\n");
say({ hooks: Object.keys(hooks).sort() });
for (const n of [1, 2, 3]) hooks.event?.({ event: { id: `evt_${n}`, type: "message.updated", properties: { n } } });
let ended = false;
process.stdin.on("data", () => {});
process.stdin.on("end", () => (ended = true));
let tick = 0;
while (!ended) {
	hooks.event?.({ event: { id: `tick_${tick}`, type: "tick", properties: { tick } } });
	tick += 1;
	await new Promise((done) => setTimeout(done, 100));
}
const started = Date.now();
await hooks.dispose?.();
say({ disposed_ms: Date.now() - started });
process.exit(0);
