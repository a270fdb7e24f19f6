#!/usr/bin/env bun
// The entry `bun build --compile` starts from; everything else lives in src/cli.
import { main } from "../src/cli/main.ts";

const code = await main(process.argv.slice(2));
if (code !== "serving") process.exit(code);
