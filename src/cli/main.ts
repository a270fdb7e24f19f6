import pkg from "../../package.json" with { type: "json" };
import { log } from "../obs/index.ts";
import { runCerts } from "./certs.ts";
import { runCluster } from "./cluster.ts";
import { generate } from "./generate.ts";
import { ConfigError, helpText, parseArgs } from "./options.ts";
import { exitOnSignal, runEngine, runGateway } from "./run-engine.ts";

/** `engine [cluster|generate] [--role ...] [options]`; returns the exit code of a command that ends. */
export async function main(argv: readonly string[]): Promise<number | "serving"> {
  const sub = argv[0] === "cluster" || argv[0] === "generate" || argv[0] === "certs" ? argv[0] : null;
  let parsed;
  try {
    parsed = parseArgs(sub ? argv.slice(1) : argv);
  } catch (e) {
    if (e instanceof ConfigError) {
      process.stderr.write(`engine: ${e.message}\n(see engine --help)\n`);
      return 2;
    }
    throw e;
  }
  if (parsed.version) {
    process.stdout.write(`engine ${pkg.version}\n`);
    return 0;
  }
  if (parsed.help) {
    process.stdout.write(helpText() + "\n");
    return 0;
  }
  try {
    if (sub === "generate") {
      await generate(parsed.config, parsed.rest);
      return 0;
    }
    if (sub === "certs") {
      process.stdout.write((await runCerts(parsed.rest)) + "\n");
      return 0;
    }
    if (sub === "cluster") {
      await runCluster(parsed.config, parsed.rest);
      return 0;
    }
    if (parsed.rest.size > 0) throw new ConfigError(`unknown option --${[...parsed.rest.keys()][0]}`);
    if (parsed.config.role === "gateway") {
      const gw = await runGateway(parsed.config);
      const deadlineMs = Number(parsed.config.gateway.drain_timeout_s) * 1000;
      exitOnSignal(async () => {
        const left = await gw.drain(deadlineMs);
        log.info("drained", { role: "gateway", unfinished: left });
        await gw.stop();
      });
      return "serving";
    }
    const node = await runEngine(parsed.config);
    const deadlineMs = Number(parsed.config.engine.drain_timeout_s) * 1000;
    exitOnSignal(async () => {
      const left = await node.shutdown(deadlineMs);
      log.info("drained", { worker_id: node.workerId, unfinished: left });
    });
    return "serving";
  } catch (e) {
    if (e instanceof ConfigError) {
      process.stderr.write(`engine: ${e.message}\n(see engine --help)\n`);
      return 2;
    }
    process.stderr.write(`engine: ${e instanceof Error ? e.message : String(e)}\n`);
    return 1;
  }
}
