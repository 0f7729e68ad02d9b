// Prints what the shipped extension computes for an adoption of process PID: its start ticks and,
// for each environment in ENVS (a JSON list of {XDG_RUNTIME_DIR?: string}), the adoption channel.
//
//   node pi_adoption_paths.mjs ASSET PID ENVS JITI   (pi's loader)
//   bun  pi_adoption_paths.mjs ASSET PID ENVS        (omp's)
const [assetPath, pidText, envs, jitiPath] = process.argv.slice(2);

async function load() {
	if (jitiPath) {
		const { createJiti } = await import(jitiPath);
		return await createJiti(import.meta.url, { moduleCache: false }).import(assetPath);
	}
	return await import(assetPath);
}

const asset = await load();
const pid = Number(pidText);
const ticks = asset.processStartTicks(pid);
const channels = JSON.parse(envs).map((env) => asset.adoptionChannel(pid, ticks, env));
console.log(JSON.stringify({ ticks, channels, gone: asset.processStartTicks(2 ** 22 + 1) }));
